"""Turn ``kvembed eval``'s arguments into configurations, checked before anything heavy loads.

- ``SOURCE`` (repeatable, optionally ``LABEL=SOURCE``): an artifact directory (its manifest fixes
  the method) or a model (folder, ``.gguf``, alias such as ``stories260k`` / ``smollm2-135m``).
- For models: ``--method`` plus the method-option flags give one configuration, exactly as
  ``kvembed embed --model``; or ``--config [LABEL=]METHOD[:option=value...]`` (repeatable, the
  ``--also`` syntax) gives one configuration each, e.g. a sweep of layer bands in one run.
- ``--baseline [LABEL=]DIR`` (repeatable): a trained sentence-transformers model folder, or a
  bundled name (``all-minilm-l6-v2``), scored after the methods as ``baseline:NAME``.

Every model configuration goes through :func:`kvembed.modeling.sources.preflight`, so a mistyped option or
an out-of-range layer fails in a second, not after the weights load.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

from ..artifact import check_artifact_options, is_artifact, load_manifest
from ..artifact.layout import split_name
from .runner import Configuration
from ..errors import InvalidInput


#: ``LABEL=SOURCE`` -> (LABEL, SOURCE): the artifact contract's NAME=DIR rule
split_label = split_name


def parse_config(text: str) -> tuple[str | None, str, dict[str, Any]]:
    """``[LABEL=]METHOD[:option=value...]`` -> (label, method, options), with --config in messages.

    Option values stay strings as typed: the method registry types them when it resolves (as for
    ``--also``), in preflight and again when the model loads."""
    from ..methods.sharing import parse_also

    try:
        request = parse_also(text)
    except ValueError as err:
        raise InvalidInput(str(err).replace("--also", "--config")) from None
    return request.label, request.method, dict(request.options)


def plan(
    sources: Sequence[str],
    configs: Sequence[str],
    method: str | None,
    options: Mapping[str, Any],
    max_length: int | None = None,
    baselines: Sequence[str] = (),
) -> list[Configuration]:
    """Configurations in command-line order, baselines last; labels must be unique (they name result files)."""
    if not sources and not baselines:
        raise InvalidInput("give at least one artifact directory or model to evaluate (kvembed eval SOURCE --task FILE), "
                           "or a trained model with --baseline DIR")
    if not sources and (configs or method is not None or options):
        raise InvalidInput("--config, --method and the option flags apply to model sources, not to --baseline; "
                           "give a model or artifact to evaluate beside the baseline")
    if configs and (method is not None or options):
        raise InvalidInput("give either --config (one per configuration) or --method with option flags, not both")
    requests = [parse_config(text) for text in configs]
    plans: list[Configuration] = []
    models = [value for value in sources if not is_artifact(split_label(value)[1])]
    for value in sources:
        label, source = split_label(value)
        if is_artifact(source):
            if configs and not models:
                raise InvalidInput(f"{source!r} is an artifact: it fixes its method and options, so --config applies "
                                 f"to models only; export one artifact per configuration, or evaluate a model")
            manifest = load_manifest(source)
            if not configs:
                check_artifact_options(manifest, method, dict(options), max_length)
            plans.append(Configuration(label or Path(source).expanduser().resolve().name, source, True, manifest=manifest))
            continue
        prefix = label or (Path(source).name or source)
        if not requests:
            name = method or "kv-embedding"
            default = name + "".join(f":{k}={v}" for k, v in options.items())
            if len(models) == 1:
                plans.append(Configuration(label or default, source, False, name, dict(options)))
            else:
                plans.append(Configuration(label or f"{prefix}/{default}", source, False, name, dict(options),
                                           model=prefix, name=default))
            continue
        for config_label, config_method, config_options in requests:
            text = config_label or config_method + "".join(f":{k}={v}" for k, v in config_options.items())
            if len(models) == 1 and not label:
                plans.append(Configuration(text, source, False, config_method, config_options))
            else:
                plans.append(Configuration(f"{prefix}/{text}", source, False, config_method, config_options,
                                           model=prefix, name=text))
    plans += [_baseline(value) for value in baselines]
    seen: set[str] = set()
    for config in plans:
        if config.label in seen or any(config.slug == other.slug for other in plans if other is not config and other.label != config.label):
            raise InvalidInput(f"two configurations are labelled {config.label!r}; name them apart with LABEL=SOURCE or "
                             f"--config LABEL=METHOD[:...]")
        seen.add(config.label)
    return plans


def _baseline(value: str) -> Configuration:
    """One ``--baseline`` value as a configuration (its folder checked, a bundled model unpacked)."""
    from .baseline import resolve

    label, source = split_label(value)
    default, folder = resolve(source)
    return Configuration(label or default, str(folder), False, baseline=True)


def preflight(configs: Sequence[Configuration]) -> None:
    """Check every model configuration's method and options against the model's config.json."""
    from ..modeling.sources import preflight as check

    for config in configs:
        if not config.artifact and not config.baseline:
            try:
                check(config.source, config.method or "kv-embedding", dict(config.options))
            except ValueError as err:
                raise InvalidInput(f"configuration {config.label!r}: {err}") from None
