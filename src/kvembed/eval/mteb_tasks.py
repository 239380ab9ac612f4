"""Local tasks as mteb v2 tasks (``AbsTaskSTS``, ``AbsTaskRetrieval``, ``AbsTaskClassification``),
and official MTEB tasks by name.

mteb's tasks load their data from the Hugging Face hub in ``load_data``; the local ones override
it to build ``datasets`` objects from the already validated rows, so nothing touches the hub.
Each local task gets its own subclass because mteb reads ``metadata`` from the class.
"""

from __future__ import annotations

import os
from typing import Any

from ..errors import KvembedError
from .tasks import LocalTask

#: the main score mteb's official tasks of each type report (and what the paper tables show)
MAIN_SCORES = {"sts": "cosine_spearman", "retrieval": "ndcg_at_10", "classification": "accuracy"}
TASK_TYPES = {"sts": "STS", "retrieval": "Retrieval", "classification": "Classification"}


class HubTaskError(KvembedError, OSError):
    """An official MTEB task whose dataset cannot be had (exit 2, one line)."""


def _metadata(task: LocalTask) -> Any:
    from mteb.abstasks.task_metadata import TaskMetadata

    return TaskMetadata(
        name=task.name,
        description=f"local {task.kind} task from {task.path} ({task.size}), run by kvembed eval",
        dataset={"path": f"local/{task.name}", "revision": "local"},
        type=TASK_TYPES[task.kind],
        category="t2t",
        modalities=["text"],
        eval_splits=["test"],
        eval_langs=["eng-Latn"],
        main_score=MAIN_SCORES[task.kind],
    )


def _sts_dataset(task: LocalTask) -> Any:
    from datasets import Dataset, DatasetDict

    return DatasetDict({"test": Dataset.from_dict(dict(task.data))})


def _retrieval_dataset(task: LocalTask) -> Any:
    from datasets import Dataset
    from mteb.abstasks.retrieval_dataset_loaders import RetrievalSplitData

    queries = Dataset.from_list([{"id": key, "text": text} for key, text in task.data["queries"].items()])
    corpus = Dataset.from_list([{"id": key, **entry} for key, entry in task.data["corpus"].items()])
    split = RetrievalSplitData(queries=queries, corpus=corpus, relevant_docs=task.data["qrels"], top_ranked=None)
    return {"default": {"test": split}}


def _classification_dataset(task: LocalTask) -> Any:
    from datasets import Dataset, DatasetDict

    names = sorted(set(task.data["label"]))
    ids = {name: index for index, name in enumerate(names)}
    splits: dict[str, Any] = {}
    for split in ("train", "test"):
        rows = [(text, ids[label]) for text, label, where in zip(task.data["text"], task.data["label"], task.data["split"]) if where == split]
        splits[split] = Dataset.from_dict({"text": [t for t, _ in rows], "label": [i for _, i in rows]})
    return DatasetDict(splits)


def to_mteb(task: LocalTask) -> Any:
    """An mteb task instance over a validated local task."""
    from mteb.abstasks.classification import AbsTaskClassification
    from mteb.abstasks.retrieval import AbsTaskRetrieval
    from mteb.abstasks.sts import AbsTaskSTS

    base, build = {
        "sts": (AbsTaskSTS, _sts_dataset),
        "retrieval": (AbsTaskRetrieval, _retrieval_dataset),
        "classification": (AbsTaskClassification, _classification_dataset),
    }[task.kind]

    def load_data(self: Any, num_proc: int | None = None, **kwargs: Any) -> None:
        if not self.data_loaded:
            self.dataset = build(task)
            self.data_loaded = True

    attributes: dict[str, Any] = {"metadata": _metadata(task), "load_data": load_data, "__module__": __name__}
    if task.kind == "sts":
        scores = task.data["score"]
        attributes.update(min_score=min(scores), max_score=max(scores))  # mteb rescales to [0, 1]: linear, no effect on correlations
    if task.kind == "classification":
        # every training row once (mteb undersamples to samples_per_label per label, n_experiments times)
        train = [label for label, split in zip(task.data["label"], task.data["split"]) if split == "train"]
        attributes.update(samples_per_label=max(train.count(label) for label in set(train)), n_experiments=1)
    cls = type(f"Local{TASK_TYPES[task.kind]}Task", (base,), attributes)
    return cls()


def official(names: list[str]) -> list[Any]:
    """Official MTEB tasks by name (``mteb.get_task``), their datasets loaded now: with the hub
    unreachable, or only the local cache allowed and the dataset not in it, this fails in seconds
    with one line instead of deep inside the evaluation."""
    import mteb

    tasks = []
    for name in names:
        try:
            tasks.append(mteb.get_task(name))
        except KeyError as err:
            raise HubTaskError(f"--mteb-task {name!r}: mteb {mteb.__version__} has no such task ({err.args[0] if err.args else err})") from None
    for task in tasks:
        dataset = task.metadata.dataset
        where = f"{dataset['path']}@{dataset.get('revision', 'main')}"
        offline = any(os.environ.get(v, "").strip().lower() in ("1", "true", "yes", "on") for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))
        if not offline:
            from ..modeling.sources import hub_unreachable

            reason = hub_unreachable()
            if reason is not None:
                raise HubTaskError(
                    f"MTEB task {task.metadata.name} loads its dataset {where} from the Hugging Face hub, which cannot "
                    f"be reached ({reason}); run it where the hub is reachable, or set HF_HUB_OFFLINE=1 to use datasets "
                    f"already in the local cache (HF_HOME)"
                )
        try:
            task.load_data()
        except Exception as err:  # datasets/huggingface_hub raise many types for a missing dataset
            detail = " ".join(str(err).split())[:200] or type(err).__name__
            raise HubTaskError(
                f"MTEB task {task.metadata.name}: cannot load its dataset {where} ({type(err).__name__}: {detail}); "
                f"with HF_HUB_OFFLINE=1 it must already be in the local datasets cache"
            ) from None
    return tasks
