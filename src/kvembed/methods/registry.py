"""The method definitions of METHODS.md, and :func:`resolve`, which checks user options."""

from __future__ import annotations

import math
from typing import Any, Mapping

from ..errors import InvalidInput, did_you_mean, shown
from .layers import AUTO, parse_layers
from .models import presets_for
from .spec import CONTEXT, KINDS, MAX_NAMED_PROMPTS, PLACEHOLDER, PROMPT_NAME, PROMPT_NAME_RULE, TEXT, MethodSpec, OptionSpec, ResolveContext, ResolvedMethod

RAW = {"query": TEXT, "document": TEXT}
#: Causal2Vec's default prompts (a checkpoint's causal2vec.json usually sets its own): the task
#: instruction on queries only, as in the paper's training data (its appendix A.3)
CAUSAL2VEC_QUERY = "Instruct: Retrieve semantically similar text\nQuery: {context}{text}"
CAUSAL2VEC_DOCUMENT = "{context}{text}"
PROMPTEOL = 'This sentence : "{text}" means in one word:"'
FUTUREEOL = 'Forecasting the subsequent tokens "{text}" in one word:"'
TP_PROMPTS = {
    "prompteol": f'This sentence : {PLACEHOLDER} "{{text}}" means in one word:"',
    "cot": f'After thinking step by step , this sentence : {PLACEHOLDER} "{{text}}" means in one word:"',
    "ke": (
        "The essence of a sentence is often captured by its main subjects and actions, while "
        "descriptive terms provide additional but less central details. With this in mind , this "
        f'sentence : {PLACEHOLDER} "{{text}}" means in one word:"'
    ),
}


def _both(template: str) -> dict[str, str]:
    return {kind: template for kind in KINDS}


# ----- option checks and defaults ---------------------------------------------------------


def _default_reroute_layers(ctx: ResolveContext) -> Any:
    """Without a preset: a relative-depth band scaled from the Qwen3-4B preset (12..21 of 36)."""
    L = ctx.num_layers
    start, stop = L // 3, max(L // 3, (7 * L) // 12)
    return f"{start}-{min(stop, L - 1)}"


def _default_aggregate_layers(ctx: ResolveContext) -> Any:
    """Without a preset: the deep half ``L//2 .. L-1`` (METHODS.md, va)."""
    return f"{ctx.num_layers // 2}-{ctx.num_layers - 1}"


def _check_layers(value: Any, ctx: ResolveContext, allow_empty: bool, auto: bool = False) -> str | None:
    parsed = parse_layers(value, ctx.num_layers)  # raises InvalidInput with the reason
    if parsed == AUTO:
        if auto:  # resolve() is torch-free and runs no model: the caller computes the set first
            return (
                "layers='auto' needs the model's intrinsic-dimension curve, which resolve() does not "
                "compute: use TorchEmbedder.from_pretrained(..., layers='auto') or run kvembed-layers, "
                "then pass the chosen set (e.g. '12-21')"
            )
        return (
            "layers='auto' (intrinsic-dimension selection) is defined for kv-embedding only; give an "
            "explicit set such as '12-21' or use the model preset"
        )
    if not parsed and not allow_empty:
        return "this method aggregates over layers and needs at least one; 'none' is only valid for kv-embedding"
    return None


def _positive_int(value: Any, ctx: ResolveContext) -> str | None:
    return None if value >= 1 else f"must be >= 1, got {value}"


def _finite(value: Any, ctx: ResolveContext) -> str | None:
    return None if math.isfinite(value) else f"must be a finite number, got {value}"


def _check_exit(value: Any, ctx: ResolveContext) -> str | None:
    L = ctx.num_layers
    return None if 1 <= value <= L else f"must be in 1..{L} (this model has {L} decoder layers), got {value}"


def _default_exit(ctx: ResolveContext) -> Any:
    return ctx.num_layers - 1


def _default_tp_stop(ctx: ResolveContext) -> Any:
    return min(7, ctx.options["exit_layer"])


def _default_tp_start(ctx: ResolveContext) -> Any:
    return min(1, ctx.options["tp_stop"])


def _check_tp_stop(value: Any, ctx: ResolveContext) -> str | None:
    return None if value >= 0 else f"must be >= 0, got {value}"


def _clamp_tp_stop(value: Any, ctx: ResolveContext) -> Any:
    """Layers from exit_layer on never run, so a stop past the exit is the exit (the official code
    accepts tp_stop=7 with exit_layer=6 and computes exactly this)."""
    return min(value, ctx.options["exit_layer"])


def _check_tp_start(value: Any, ctx: ResolveContext) -> str | None:
    stop = ctx.given.get("tp_stop")
    stop = ctx.options["tp_stop"] if stop is None else stop
    return None if 0 <= value <= stop else f"must be in 0..tp_stop={stop}, got {value}"


def _clamp_tp_start(value: Any, ctx: ResolveContext) -> Any:
    return min(value, ctx.options["tp_stop"])


def _layers_option(default: Any, allow_empty: bool, help: str, auto: bool = False) -> OptionSpec:
    return OptionSpec(
        "layers",
        str,
        default,
        help,
        check=lambda value, ctx: _check_layers(value, ctx, allow_empty, auto),
        flag="Layer set: '12-21', '10,11,26-31', 'none', 'auto'.",
    )


def _prompt_option(names: tuple[str, ...], default: str, placeholder: bool = False) -> OptionSpec:
    needs = "'{text}'" + (f" and '{PLACEHOLDER}'" if placeholder else "")

    def check(value: Any, ctx: ResolveContext) -> str | None:
        if value in names:
            return None
        if "{text}" in value and (not placeholder or value.count(PLACEHOLDER) == 1):
            return None
        return f"must be one of {', '.join(names)} or a template containing {needs}, got {value!r}"

    return OptionSpec("prompt", str, default, f"prompt: {', '.join(names)}, or a custom template with {needs}", check=check,
                      flag="Named prompt of the method, or a template with {text}.")


# ----- the methods -----------------------------------------------------------------------

METHODS: dict[str, MethodSpec] = {}


def register(spec: MethodSpec) -> MethodSpec:
    METHODS[spec.name] = spec
    return spec


register(
    MethodSpec(
        name="kv-embedding",
        summary="Re-route the last token's key/value as a prefix in the middle layers (Tang & Yang).",
        prompts={
            "compress": {
                "query": '"Query: {text}" Compress the Query in one word:',
                "document": '"Context: {text}" Compress the Context in one word:',
            }
        },
        default_prompt="compress",
        readout="hidden",
        pooling="last-mean",
        reroute=True,
        paper="kv-embedding.txt",
        options=(
            _layers_option(
                _default_reroute_layers, True, "re-routing layer set R ('12-21', '10,11,26-31', 'none', 'auto')", auto=True
            ),
            OptionSpec("bias", float, 1.0, "logit bias added to the prefix column", check=_finite,
                       flag="kv-embedding: prefix logit bias."),
            OptionSpec("num_prefix", int, 1, "prepend the key/value of the last n real tokens", check=_positive_int,
                       flag="kv-embedding: prepend the last n tokens."),
            OptionSpec("prefix_rope", str, "keep", "prefix key rotation: its own position or position 0", ("keep", "zero"),
                       flag="kv-embedding: keep or zero."),
            OptionSpec("pooling", str, "last-mean", "pooling of final hidden states", ("last-mean", "last", "mean"),
                       flag="kv-embedding: last-mean, last or mean."),
            _prompt_option(("compress",), "compress"),
        ),
    )
)

register(
    MethodSpec(
        name="va",
        summary="Value Aggregation: mean of value vectors over real tokens and layers (Zhang et al.).",
        prompts={"raw": RAW},
        default_prompt="raw",
        readout="values",
        paper="value-aggregation.txt",
        options=(_layers_option(_default_aggregate_layers, False, "aggregation layer set S"),),
    )
)

register(
    MethodSpec(
        name="aligned-wva",
        summary="Aligned weighted VA: last token's attention output after o_proj, averaged over layers.",
        prompts={"prompteol": _both(PROMPTEOL), "futureeol": _both(FUTUREEOL)},
        default_prompt="prompteol",
        readout="attention-output",
        paper="value-aggregation.txt",
        options=(
            _layers_option(_default_aggregate_layers, False, "aggregation layer set S"),
            _prompt_option(("prompteol", "futureeol"), "prompteol"),
            OptionSpec("wva", bool, False, "read the attention output before o_proj (concatenated heads)",
                       flag="aligned-wva: read before o_proj."),
        ),
    )
)

register(
    MethodSpec(
        name="token-prepending",
        summary="Feed the last token's state into a <PST> placeholder in early layers (Fu et al.).",
        prompts={name: _both(template) for name, template in TP_PROMPTS.items()},
        default_prompt="prompteol",
        readout="residual",
        preprocess=True,
        placeholder=True,
        paper="token-prepending.txt",
        options=(
            OptionSpec("exit_layer", int, _default_exit, "output after decoder layer exit_layer-1 (early exit)", check=_check_exit,
                       flag="token-prepending: early-exit layer."),
            OptionSpec("tp_stop", int, _default_tp_stop, "last prepending layer + 1 (past exit_layer: the exit)",
                       check=_check_tp_stop, clamp=_clamp_tp_stop, flag="token-prepending: last rewired layer + 1."),
            OptionSpec("tp_start", int, _default_tp_start, "first layer whose input is rewired", check=_check_tp_start,
                       clamp=_clamp_tp_start, flag="token-prepending: first rewired layer."),
            _prompt_option(tuple(TP_PROMPTS), "prompteol", placeholder=True),
        ),
    )
)

register(
    MethodSpec(
        name="last-token",
        summary="Baseline: final normed hidden state of the last real token of the raw text.",
        prompts={"raw": RAW},
        default_prompt="raw",
        readout="hidden",
        pooling="last",
    )
)

register(
    MethodSpec(
        name="mean",
        summary="Baseline: mean of final normed hidden states over the raw text's real tokens.",
        prompts={"raw": RAW},
        default_prompt="raw",
        readout="hidden",
        pooling="mean",
    )
)

register(
    MethodSpec(
        name="prompteol",
        summary="Baseline: PromptEOL prompt, last token's final normed hidden state.",
        prompts={"prompteol": _both(PROMPTEOL)},
        default_prompt="prompteol",
        readout="hidden",
        pooling="last",
        preprocess=True,
    )
)

register(
    MethodSpec(
        name="echo",
        summary="Baseline: echo prompt, mean over the tokens of the text's second occurrence.",
        prompts={"echo": _both("Rewrite the sentence: {text}, rewritten sentence: {text}")},
        default_prompt="echo",
        readout="hidden",
        pooling="span",
    )
)



def _check_context_template(value: Any, ctx: ResolveContext) -> str | None:
    if value.count(CONTEXT) != 1 or TEXT not in value:
        return f"must contain {CONTEXT} once and {TEXT}, got {value!r}"
    if value.index(CONTEXT) > value.index(TEXT):
        return f"must put {CONTEXT} before {TEXT} (the Contextual token precedes the text), got {value!r}"
    return None


def _check_placeholder(value: Any, ctx: ResolveContext) -> str | None:
    return None if value.strip() else "must name the token the Contextual token replaces (e.g. '<s>'); it comes from causal2vec.json"


register(
    MethodSpec(
        name="causal2vec",
        summary="Causal2Vec (trained): an encoder's Contextual token replaces a placeholder; concat of its and EOS's states.",
        prompts={"checkpoint": {"query": CAUSAL2VEC_QUERY, "document": CAUSAL2VEC_DOCUMENT}},
        default_prompt="checkpoint",
        readout="hidden",
        pooling="context-eos",
        contextual=True,
        paper="causal2vec.txt",
        options=(
            OptionSpec("placeholder", str, "", "the LLM token the Contextual token replaces (causal2vec.json)", check=_check_placeholder),
            OptionSpec("query_template", str, CAUSAL2VEC_QUERY, f"query prompt with {CONTEXT} and {TEXT}", check=_check_context_template),
            OptionSpec("document_template", str, CAUSAL2VEC_DOCUMENT, f"document prompt with {CONTEXT} and {TEXT}",
                       check=_check_context_template),
            OptionSpec("eos", str, "", "token text appended after the prompt (the LLM's EOS; '' appends nothing)"),
        ),
    )
)

def _check_text_template(value: Any, ctx: ResolveContext) -> str | None:
    return None if value.count(TEXT) == 1 else f"must contain {TEXT} once, got {shown(value)}"


def _check_named_prompts(value: Any, ctx: ResolveContext) -> str | None:
    """The folder's other prompts: names a request can carry (``input_type``, ``prompt_name``),
    each a template with the text once."""
    if len(value) > MAX_NAMED_PROMPTS - len(KINDS):
        return f"holds {len(value)} prompts; at most {MAX_NAMED_PROMPTS - len(KINDS)}"
    for name, template in value.items():
        if not PROMPT_NAME.fullmatch(name) or name in KINDS:
            return f"has a prompt named {shown(name)}: a name is {PROMPT_NAME_RULE}, not query or document"
        problem = _check_text_template(template, ctx)
        if problem:
            return f"prompt {name} {problem}"
    return None


register(
    MethodSpec(
        name="st",
        summary="A trained embedder's own recipe, from its sentence-transformers folder: its pooling and its prompts.",
        prompts={"checkpoint": {"query": TEXT, "document": TEXT}},
        default_prompt="checkpoint",
        readout="hidden",
        pooling="last",
        options=(
            OptionSpec("pooling", str, "last", "pooling of final hidden states (1_Pooling/config.json)", ("last", "mean")),
            OptionSpec("query_template", str, TEXT, f"query prompt with {TEXT} (config_sentence_transformers.json)",
                       check=_check_text_template),
            OptionSpec("document_template", str, TEXT, f"document prompt with {TEXT} (config_sentence_transformers.json)",
                       check=_check_text_template),
            OptionSpec("named_prompts", dict, {}, f"the folder's other named prompts, name -> template with {TEXT}",
                       check=_check_named_prompts),
        ),
    )
)

#: the method ``kvembed export`` and ``kvembed embed --model`` use without ``--method``
DEFAULT_METHOD = "kv-embedding"

#: Names reserved for later issues, so users get a precise message instead of "unknown".
PLANNED: Mapping[str, str] = {}


def get_method(name: str) -> MethodSpec:
    key = name.strip().lower()
    if key in METHODS:
        return METHODS[key]
    if key in PLANNED:
        raise InvalidInput(f"method {name!r}: {PLANNED[key]}; available methods: {', '.join(METHODS)}")
    close = did_you_mean(key, METHODS)
    raise InvalidInput(f"unknown method {name!r}; {close + ' ' if close else ''}available methods: {', '.join(METHODS)}")


def resolve(
    method: str | MethodSpec,
    num_layers: int,
    preset_id: str | None = None,
    **options: Any,
) -> ResolvedMethod:
    """Check ``options`` against ``method`` for a model with ``num_layers`` decoder layers.

    Unknown options, wrong types and out-of-range values raise :class:`~kvembed.errors.InvalidInput`
    (a ``ValueError``) naming the valid choices. Options left out take the model preset, then the
    method default.
    """
    spec = method if isinstance(method, MethodSpec) else get_method(method)
    unknown = sorted(set(options) - set(spec.option_names))
    if unknown:
        valid = ", ".join(spec.option_names) or "(none)"
        raise InvalidInput(f"unknown option {', '.join(unknown)} for method {spec.name!r}; valid options: {valid}")
    presets = presets_for(preset_id, spec.name)
    resolved: dict[str, Any] = {}
    requested: dict[str, Any] = {}
    for opt in spec.options:
        ctx = ResolveContext(num_layers=num_layers, model_id=preset_id, presets=presets, options=resolved, given=requested)
        given = options.get(opt.name)
        if given is not None:
            value = given
        elif opt.name in presets:
            value = presets[opt.name]
        else:
            value = opt.default(ctx) if callable(opt.default) else opt.default
        value = _coerce(spec.name, opt, value)
        if given is not None:
            requested[opt.name] = value  # the user's value, typed, before any clamp
        if opt.choices is not None and value not in opt.choices:
            raise InvalidInput(
                f"option {opt.name}={value!r} of method {spec.name!r} is not valid; choose one of "
                f"{', '.join(map(str, opt.choices))}"
            )
        if opt.check is not None:
            problem = opt.check(value, ctx)
            if problem:
                raise InvalidInput(f"option {opt.name} of method {spec.name!r} {problem}")
        if opt.clamp is not None:
            value = opt.clamp(value, ctx)
        resolved[opt.name] = value

    layers: tuple[int, ...] = ()
    if "layers" in resolved:
        parsed = parse_layers(resolved["layers"], num_layers)
        assert parsed != AUTO
        layers = parsed  # type: ignore[assignment]
        resolved["layers"] = list(layers)

    prompt = resolved.get("prompt", spec.default_prompt)
    templates = dict(spec.prompts[prompt]) if prompt in spec.prompts else {kind: prompt for kind in KINDS}
    if "query_template" in resolved:  # a checkpoint's own templates (Causal2Vec's with its EOS appended)
        named = {name: template + resolved.get("eos", "") for name, template in resolved.get("named_prompts", {}).items()}
        templates = {**{kind: resolved[f"{kind}_template"] + resolved.get("eos", "") for kind in KINDS}, **named}
    return ResolvedMethod(
        name=spec.name,
        options=resolved,
        layers=layers,
        num_layers=num_layers,
        layers_needed=_layers_needed(spec, resolved, layers, num_layers),
        templates=templates,
        readout=spec.readout,
        pooling=resolved.get("pooling", spec.pooling),
        preprocess=spec.preprocess,
        reroute=spec.reroute and bool(layers),
        placeholder=spec.placeholder,
        contextual=spec.contextual,
    )


def _layers_needed(spec: MethodSpec, options: Mapping[str, Any], layers: tuple[int, ...], num_layers: int) -> int:
    if spec.readout in ("values", "attention-output"):
        return max(layers) + 1
    if spec.readout == "residual":
        return int(options["exit_layer"])
    return num_layers


def _coerce(method: str, opt: OptionSpec, value: Any) -> Any:
    """Accept CLI strings and ints-for-floats; refuse everything else with the expected type."""
    if opt.name == "layers":
        if isinstance(value, str):
            return value
        if isinstance(value, int) and not isinstance(value, bool):
            return [value]
        if hasattr(value, "__iter__") and all(isinstance(i, int) and not isinstance(i, bool) for i in value):
            return [int(i) for i in value]
        raise InvalidInput(f"option layers of method {method!r} expects a layer set like '12-21' or a list of ints, got {value!r}")
    try:
        if opt.type is bool:
            if isinstance(value, bool):
                return value
            if isinstance(value, str) and value.strip().lower() in ("true", "1", "yes", "false", "0", "no"):
                return value.strip().lower() in ("true", "1", "yes")
            raise TypeError
        if opt.type is int:
            if isinstance(value, bool):
                raise TypeError
            if isinstance(value, float) and not value.is_integer():
                raise TypeError
            return int(value)
        if opt.type is float:
            if isinstance(value, bool):
                raise TypeError
            return float(value)
        if opt.type is str:
            if not isinstance(value, str):
                raise TypeError
            return value
        if opt.type is dict:
            if not isinstance(value, Mapping) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
                raise TypeError
            return dict(value)
    except (TypeError, ValueError):
        pass
    raise InvalidInput(f"option {opt.name} of method {method!r} expects {opt.type.__name__}, got {value!r}")
