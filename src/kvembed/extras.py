"""Which ``pip install 'kvembed[EXTRA]'`` brings a missing module, spelled in one place.

Every command of the ``kvembed`` command line is listed whatever is installed; the packages one
command needs come with its extra (pyproject.toml), so a command run without them must say which
extra to install, not show an import traceback. Every install hint kvembed prints comes from
:func:`install_hint` (no hand-typed copy can lose its ``[extra]``).
"""

from __future__ import annotations

#: top-level import name -> the extra that installs it (pyproject.toml's optional-dependencies)
EXTRA_OF_MODULE: dict[str, str] = {
    **dict.fromkeys(("typer", "rich", "click"), "cli"),
    **dict.fromkeys(("torch", "transformers", "safetensors", "onnx", "onnxscript", "polygraphy", "scipy", "matplotlib"), "export"),
    **dict.fromkeys(("gguf", "accelerate"), "gguf"),
    "peft": "causal2vec",
    **dict.fromkeys(("fastapi", "starlette", "uvicorn", "prometheus_client"), "serve"),
    "tritonclient": "triton",
    **dict.fromkeys(("pyarrow", "ray"), "corpus"),
    **dict.fromkeys(("mteb", "sentence_transformers"), "eval"),
    "openvino": "openvino",
    "packaging": "bundle",
    "model_signing": "sign",
}


#: the extras of pyproject.toml that an install hint may name
EXTRAS = frozenset({*EXTRA_OF_MODULE.values(), "gpu"})


def install_hint(extra: str) -> str:
    """``pip install 'kvembed[EXTRA]'`` (quoted for the shell); ValueError for an extra kvembed has not."""
    if extra not in EXTRAS:
        raise ValueError(f"kvembed has no extra {extra!r} (extras: {', '.join(sorted(EXTRAS))})")
    return f"pip install 'kvembed[{extra}]'"


def missing_extra_message(err: ImportError, command: str | None = None) -> str | None:
    """One line naming the extra that installs the module ``err`` could not import, or None when
    the module is not one an extra brings (then it is a real bug or a broken install)."""
    name = getattr(err, "name", None) or ""
    extra = EXTRA_OF_MODULE.get(name.split(".")[0])
    if extra is None:
        return None
    who = command or "this command"
    torch_first = " (CPU torch first: pip install torch, or your platform's build)" if extra == "export" and name.startswith("torch") else ""
    return f"{who} needs the {extra!r} extra (no module named {name!r}): {install_hint(extra)}{torch_first}"
