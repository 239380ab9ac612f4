"""Several methods from one forward pass (``kvembed-export --also``). Torch-free.

A forward pass is fixed by its input (prompt template, text clean-up, placeholder) and by the
*mutations* a method applies on the way (token prepending rewires layer inputs, kv-embedding
re-routes attention). An extra method can read its output from the main method's pass when the
inputs are identical and the mutations the main method applies *before the extra method's last
readout point* are exactly those the extra method would apply itself. Mutations after that
point cannot change what it reads, so ``va`` over layers 4..12 shares a pass with kv-embedding
re-routing layers 12..21 (values are read before layer 12's attention), while ``va`` over
layers 18..35 does not.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping

from ..errors import InvalidInput
from .layers import format_layers
from .spec import ResolvedMethod

#: Points of the forward pass, ordered as (layer, stage); see :func:`mutations`/:func:`read_point`.
REWIRE, VALUES, ATTENTION, ATTENTION_OUT, LAYER_OUT = 0, 1, 2, 3, 4
LABEL = re.compile(r"^[a-z0-9][a-z0-9_-]*$")


@dataclass(frozen=True)
class AlsoRequest:
    """One ``--also`` value: ``[LABEL=]METHOD[:option=value[:option=value...]]``."""

    method: str
    options: Mapping[str, Any]
    label: str | None = None


def parse_also(text: str) -> AlsoRequest:
    """Parse ``va``, ``va:layers=8-12``, ``last=kv-embedding:pooling=last``."""
    if not isinstance(text, str) or not text.strip():
        raise InvalidInput(f"--also expects METHOD[:option=value...], got {text!r}")
    head, *parts = text.strip().split(":")
    label = None
    if "=" in head:
        label, head = (s.strip() for s in head.split("=", 1))
        if not LABEL.match(label):
            raise InvalidInput(
                f"--also label {label!r} must be lower-case letters, digits, '-' or '_' (it names graph outputs)"
            )
    options: dict[str, Any] = {}
    for part in parts:
        key, sep, value = part.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key:
            raise InvalidInput(f"--also {text!r}: expected option=value after ':', got {part!r}")
        if key in options:
            raise InvalidInput(f"--also {text!r}: option {key} given twice")
        options[key] = value.strip()
    return AlsoRequest(method=head.strip().lower(), options=options, label=label)


def mutations(method: ResolvedMethod) -> set[tuple[Any, ...]]:
    """What ``method`` changes in the forward pass, each tagged with its (layer, stage) point."""
    changes: set[tuple[Any, ...]] = set()
    if method.placeholder:
        for layer in range(int(method.options["tp_start"]), int(method.options["tp_stop"])):
            changes.add((layer, REWIRE, "prepend"))
    if method.reroute:
        opts = method.options
        detail = ("reroute", float(opts["bias"]), int(opts["num_prefix"]), str(opts["prefix_rope"]))
        for layer in method.layers:
            changes.add((layer, ATTENTION, *detail))
    return changes


def read_point(method: ResolvedMethod) -> tuple[int, int]:
    """The latest (layer, stage) point the method's readout depends on."""
    if method.readout == "values":
        return (max(method.layers), VALUES)
    if method.readout == "attention-output":
        return (max(method.layers), ATTENTION_OUT)
    if method.readout == "residual":
        return (int(method.options["exit_layer"]) - 1, LAYER_OUT)
    return (method.num_layers, REWIRE)  # final hidden states: after every layer


def _before(changes: set[tuple[Any, ...]], point: tuple[int, int]) -> set[tuple[Any, ...]]:
    return {c for c in changes if (c[0], c[1]) < point}


def _describe(changes: set[tuple[Any, ...]]) -> str:
    if not changes:
        return "nothing"
    parts = []
    prepend = sorted(c[0] for c in changes if c[2] == "prepend")
    if prepend:
        parts.append(f"token prepending before {_layers(prepend)}")
    reroutes: dict[tuple[Any, ...], list[int]] = {}
    for c in changes:
        if c[2] == "reroute":
            reroutes.setdefault(c[3:], []).append(c[0])
    for (bias, num_prefix, rope), layers in sorted(reroutes.items()):
        parts.append(
            f"KV re-routing in {_layers(sorted(layers))} (bias {bias:g}, num_prefix {num_prefix}, prefix_rope {rope})"
        )
    return "; ".join(parts)


def _layers(layers: list[int]) -> str:
    return f"layer {layers[0]}" if len(layers) == 1 else f"layers {format_layers(layers)}"


def _point(point: tuple[int, int], num_layers: int) -> str:
    layer, stage = point
    if layer >= num_layers:
        return "the final hidden states"
    return {
        VALUES: f"layer {layer}'s value vectors",
        ATTENTION_OUT: f"layer {layer}'s attention output",
        LAYER_OUT: f"the output of layer {layer}",
    }.get(stage, f"layer {layer}")


def sharing_problem(main: ResolvedMethod, other: ResolvedMethod) -> str | None:
    """Why ``other`` cannot be read from ``main``'s forward pass, or None if it can."""
    who = f"the extra output {other.name!r} cannot be read from the main {main.name!r} forward pass"
    if dict(main.templates) != dict(other.templates):
        return (
            f"{who}: its prompt differs ({other.templates['document']!r} vs {main.templates['document']!r}), "
            "so the token ids differ"
        )
    if main.contextual or other.contextual:
        return f"{who}: Causal2Vec replaces an input embedding with its Contextual token, so its forward pass is its own"
    if main.preprocess != other.preprocess:
        return f"{who}: one cleans up the text before formatting (token-prepending/PromptEOL style) and the other does not"
    if main.placeholder != other.placeholder:
        return f"{who}: only one of them inserts the {'<PST>'} placeholder"
    if main.uses_pool_mask != other.uses_pool_mask:
        return f"{who}: only one of them pools over an echo span"
    # only the main method's changes are applied: the extra one must see exactly its own
    point = read_point(other)
    applied, own = _before(mutations(main), point), _before(mutations(other), point)
    if applied != own:
        return (
            f"{who}: before {_point(point, other.num_layers)}, which the extra output reads, the main "
            f"method applies {_describe(applied)} but the extra one would apply {_describe(own)}; "
            "export them separately, or choose layers so the changes come after what is read"
        )
    return None


def default_label(name: str, taken: set[str]) -> str:
    """``va``, then ``va-2``, ``va-3`` for repeats."""
    if name not in taken:
        return name
    n = 2
    while f"{name}-{n}" in taken:
        n += 1
    return f"{name}-{n}"


def output_names(label: str | None) -> tuple[str, str]:
    """Graph output names of a method: the main one's are ``embedding``/``pooled``."""
    if label is None:
        return ("embedding", "pooled")
    return (f"embedding.{label}", f"pooled.{label}")


def resolve_also(
    main: ResolvedMethod,
    requests: "list[AlsoRequest | str] | tuple[AlsoRequest | str, ...]",
    preset_id: str | None = None,
) -> dict[str, ResolvedMethod]:
    """Resolve ``--also`` requests for the model ``main`` was resolved for: label -> method.

    Raises InvalidInput naming the request and the reason when one is invalid or cannot share
    ``main``'s forward pass.
    """
    from .registry import get_method, resolve

    resolved: dict[str, ResolvedMethod] = {}
    for item in requests:
        request = parse_also(item) if isinstance(item, str) else item
        spec = get_method(request.method)
        if str(request.options.get("layers", "")).strip().lower() == "auto":
            raise InvalidInput(f"--also {spec.name}: layers=auto is not available for extra outputs; give the set, e.g. layers=12-21")
        try:
            method = resolve(spec, main.num_layers, preset_id, **request.options)
        except InvalidInput as err:
            raise InvalidInput(f"--also {spec.name}: {err}") from None
        problem = sharing_problem(main, method)
        if problem:
            raise InvalidInput(f"--also {spec.name}: {problem}")
        label = request.label or default_label(spec.name, set(resolved) | {main.name})
        if label in resolved or label == main.name and request.label is not None:
            raise InvalidInput(f"--also label {label!r} is used twice; give each extra output its own label")
        resolved[label] = method
    return resolved


def output_label(output: str | None, main: str, labels: "list[str] | tuple[str, ...] | Mapping[str, Any]") -> str | None:
    """The extra-output label ``output`` names, or None for the main method (``None`` or its name);
    InvalidInput listing what there is otherwise."""
    if output is None or (output == main and output not in labels):
        return None
    if output not in labels:
        raise InvalidInput(f"no output {output!r}; this embedder computes: {', '.join([main, *labels])}")
    return output
