"""Capacity plan: how many dialogues an engine's KV cache holds, and what that gives per hour.

A dialogue keeps two prompt chains cached (the doctor's view and the patient's view), each
growing by one exchange (the turn's instruction, the question, the answer) per exchange. Its
KV footprint peaks at the end; averaged over its life it is about half-way. With continuous
admission the dialogues in flight are spread over their lives, so an engine holds about
``fill × KV tokens ÷ time-averaged footprint`` of them (``dialogues_in_flight``), and every one
of them at its peak at once only ``KV tokens ÷ peak footprint`` (``dialogues_at_peak``).

    KV bytes per token = 2 (K and V) × layers × KV heads × head size × bytes per element
    KV memory per GPU  = GPU memory × gpu_memory_utilization − weights ÷ TP − reserve
    KV tokens per engine = TP × KV memory per GPU ÷ (KV bytes per token ÷ TP)

Known models and GPUs are tables here (so it works offline); a local Hugging Face folder is read
from its ``config.json`` (and its weights' size). Throughput is a projection from the published
7–8B anchor on one H100 (5,800–8,100 output tok/s at ≥ 256 sequences, shared/FACTS.md), scaled by
memory bandwidth, by model size and by the requests in flight: decoding is bandwidth-bound.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, TypedDict


@dataclass(frozen=True)
class ModelShape:
    name: str
    layers: int
    kv_heads: int
    head_dim: int
    params_b: float  # billions of parameters
    dtype_bytes: int = 2

    def kv_bytes_per_token(self, kv_dtype_bytes: float | None = None) -> float:
        return 2 * self.layers * self.kv_heads * self.head_dim * (kv_dtype_bytes or self.dtype_bytes)

    @property
    def weight_gb(self) -> float:
        return self.params_b * self.dtype_bytes


@dataclass(frozen=True)
class GPU:
    name: str
    memory_gb: float
    bandwidth_tb_s: float


MODELS = {m.name.lower(): m for m in (
    ModelShape("Qwen/Qwen2.5-1.5B-Instruct", 28, 2, 128, 1.54),
    ModelShape("Qwen/Qwen2.5-3B-Instruct", 36, 2, 128, 3.09),
    ModelShape("Qwen/Qwen2.5-7B-Instruct", 28, 4, 128, 7.62),
    ModelShape("Qwen/Qwen2.5-14B-Instruct", 48, 8, 128, 14.7),
    ModelShape("Qwen/Qwen2.5-32B-Instruct", 64, 8, 128, 32.8),
    ModelShape("Qwen/Qwen2.5-72B-Instruct", 80, 8, 128, 72.7),
    ModelShape("Qwen/Qwen3-8B", 36, 8, 128, 8.19),
    ModelShape("meta-llama/Llama-3.1-8B-Instruct", 32, 8, 128, 8.03),
    ModelShape("meta-llama/Llama-3.1-70B-Instruct", 80, 8, 128, 70.6),
)}

GPUS = {g.name: g for g in (
    GPU("h100-80gb", 80, 3.35),
    GPU("h200-141gb", 141, 4.8),
    GPU("a100-80gb", 80, 2.04),
    GPU("a100-40gb", 40, 1.56),
    GPU("l40s-48gb", 48, 0.86),
    GPU("a10g-24gb", 24, 0.6),
    GPU("l4-24gb", 24, 0.3),
)}

class Anchor(TypedDict):
    """A published throughput figure: ``output_tok_s`` of a ``params_b`` model on ``gpu`` at ``batch``."""

    gpu: str
    params_b: float
    output_tok_s: tuple[float, float]
    batch: int


# Published anchor: 7-8B models on one H100, >= 256 sequences in flight (shared/FACTS.md).
ANCHOR: Anchor = {"gpu": "h100-80gb", "params_b": 7.6, "output_tok_s": (5800.0, 8100.0), "batch": 256}
RESERVE_GB = 2.0  # activations, CUDA graphs and allocator slack per GPU, beside weights and KV
QWEN_TOKENS_PER_CHAR = 0.75  # Qwen2's tokenizer on Chinese text, roughly


@dataclass(frozen=True)
class DialogueShape:
    """Tokens of one dialogue. Defaults: the project's prompts (system prompts and per-turn
    instructions measured on the sample cases, in Qwen tokens) and MDD-5k's turn lengths."""

    exchanges: float = 34.0  # the project's dialogues ending by the dialogue logic (sample cases)
    doctor_turn: int = 74  # MDD-5k: 99 characters per doctor turn
    patient_turn: int = 98  # MDD-5k: 131 characters per patient turn
    doctor_system: int = 190  # persona prompt + opening stage direction (253 characters)
    patient_system: int = 716  # case, experience and role (954 characters)
    doctor_instruction: int = 53  # per doctor turn (71 characters)
    patient_instruction: int = 32  # per patient turn (43 characters)
    tool_calls_per_exchange: float = 0.73  # verdicts: a few output tokens each
    story_tokens: int = 190

    def _chains_at(self, k: float) -> tuple[float, float]:
        turn = self.doctor_turn + self.patient_turn
        return (self.doctor_system + k * (self.doctor_instruction + turn),
                self.patient_system + k * (self.patient_instruction + turn))

    roles: tuple[str, ...] = ("doctor", "patient", "tool")  # the roles served by the engine planned

    def chains_at(self, k: float) -> tuple[float, float]:
        """(doctor view, patient view) tokens after ``k`` exchanges, 0 for a view this engine never
        holds: the doctor's for doctor or tool calls (verdicts branch off it), the patient's for
        patient or tool calls (TriggerExp)."""
        d, p = self._chains_at(k)
        return (d if {"doctor", "tool"} & set(self.roles) else 0.0,
                p if {"patient", "tool", "companion"} & set(self.roles) else 0.0)

    @property
    def peak_tokens(self) -> float:
        return sum(self.chains_at(self.exchanges))

    @property
    def mean_tokens(self) -> float:
        """Footprint averaged over the dialogue's life (it grows linearly)."""
        return (sum(self.chains_at(0)) + self.peak_tokens) / 2

    @property
    def output_tokens(self) -> float:
        r = set(self.roles)
        tool = "tool" in r
        return (self.exchanges * (self.doctor_turn * ("doctor" in r) + self.patient_turn * ("patient" in r)
                                  + 3 * self.tool_calls_per_exchange * tool) + self.story_tokens * tool)


def model_shape(model: str) -> ModelShape:
    """A known model by name, or a local Hugging Face folder (its config.json and weights)."""
    key = model.lower()
    if key in MODELS:
        return MODELS[key]
    for name, m in MODELS.items():  # "Qwen2.5-7B-Instruct" without the organisation
        if name.split("/", 1)[-1] == key:
            return m
    cfg_path = Path(model) / "config.json"
    if cfg_path.is_file():
        c = json.loads(cfg_path.read_text(encoding="utf-8"))
        heads = int(c["num_attention_heads"])
        head_dim = int(c.get("head_dim") or c["hidden_size"] // heads)
        dtype_bytes = 4 if str(c.get("torch_dtype", "bfloat16")) == "float32" else 2
        weights = sum(p.stat().st_size for p in Path(model).glob("*.safetensors")) or \
            sum(p.stat().st_size for p in Path(model).glob("*.bin"))
        return ModelShape(str(model), int(c["num_hidden_layers"]), int(c.get("num_key_value_heads", heads)),
                          head_dim, weights / dtype_bytes / 1e9, dtype_bytes)
    known = ", ".join(m.name for m in MODELS.values())
    raise ValueError(f"engine.model: unknown model {model!r} (no config.json there either); known: {known}")


def kv_dtype_bytes(kv_cache_dtype: str, model: ModelShape) -> float:
    return 1.0 if str(kv_cache_dtype).startswith("fp8") else float(model.dtype_bytes)


def plan_engine(model: ModelShape, gpu: GPU, *, tp: int = 1, gpu_memory_utilization: float = 0.9,
                kv_cache_dtype: str = "auto", fill: float = 0.9, shape: DialogueShape = DialogueShape(),
                max_model_len: int | None = None) -> dict[str, Any]:
    """The figures for one engine (``tp`` GPUs) of ``model`` on ``gpu``."""
    kvb = model.kv_bytes_per_token(kv_dtype_bytes(kv_cache_dtype, model))
    weights_per_gpu = model.weight_gb / tp
    kv_gb_per_gpu = gpu.memory_gb * gpu_memory_utilization - weights_per_gpu - RESERVE_GB
    fits = kv_gb_per_gpu > 0
    kv_tokens = int(max(0.0, kv_gb_per_gpu) * 1e9 * tp / kvb) if fits else 0
    in_flight = int(fill * kv_tokens / shape.mean_tokens)
    at_peak = int(kv_tokens / shape.peak_tokens)
    # throughput: a decode step reads the weights once (t_w) and costs t_seq more per sequence in the
    # batch; t_seq is fitted to the anchor (t_w + 256 t_seq = 256 / anchor tok/s) and scaled by model
    # size and bandwidth. A dialogue has a call in flight about 80% of its life (measured occupancy).
    requests = 0.8 * in_flight
    bw = gpu.bandwidth_tb_s * tp
    anchor_bw = GPUS[ANCHOR["gpu"]].bandwidth_tb_s
    anchor_tw = ANCHOR["params_b"] * 2 / anchor_bw  # ms
    t_w = model.weight_gb / bw
    tok_s = []
    for anchor in ANCHOR["output_tok_s"]:
        t_seq = (ANCHOR["batch"] / anchor * 1000 - anchor_tw) / ANCHOR["batch"]
        t_seq *= (model.params_b / ANCHOR["params_b"]) * (anchor_bw / bw)
        tok_s.append(round(requests / (t_w + requests * t_seq) * 1000) if requests > 0 else 0)
    per_hour = [round(x / shape.output_tokens * 3600) for x in tok_s]
    out = {
        "model": model.name, "gpu": gpu.name, "tensor_parallel_size": tp, "kv_cache_dtype": kv_cache_dtype,
        "gpu_memory_utilization": gpu_memory_utilization,
        "kv_bytes_per_token": int(kvb),
        "weights_gb_per_gpu": round(weights_per_gpu, 1),
        "kv_gb_per_gpu": round(kv_gb_per_gpu, 1),
        "kv_tokens_per_engine": kv_tokens,
        "dialogue": {**asdict(shape), "peak_tokens": round(shape.peak_tokens),
                     "mean_tokens": round(shape.mean_tokens), "output_tokens": round(shape.output_tokens)},
        "fill": fill,
        "dialogues_in_flight": in_flight,
        "dialogues_at_peak": at_peak,
        "kv_tokens_per_dialogue_in_flight": round(kv_tokens / in_flight) if in_flight else None,
        "output_tok_s": tok_s,
        "dialogues_per_hour": per_hour,
        "dialogues_per_hour_per_gpu": [round(x / tp) for x in per_hour],
        "throughput_kind": "projection: the H100 7-8B anchor as weight reads + a per-sequence cost, "
                           "scaled by model size, bandwidth and the requests in flight",
        "fits": fits and in_flight >= 1,
    }
    if max_model_len is not None:
        longest = max(shape.chains_at(shape.exchanges))
        out["longest_prompt_tokens"] = round(longest)
        out["max_model_len_ok"] = longest + shape.patient_turn <= max_model_len
    return out


def plan_config(cfg: Any, gpu_name: str | None = None, fill: float | None = None,
                shape: DialogueShape | None = None) -> dict[str, Any]:
    """Plan the engine of a loaded ``Config`` (``engine.model``, ``engine.vllm``) on ``gpu_name``."""
    gpu_name = (gpu_name or "h100-80gb").lower()
    if gpu_name not in GPUS:
        raise ValueError(f"--gpu: unknown GPU {gpu_name!r}; known: {', '.join(GPUS)}")
    o = cfg.engine.vllm
    model = model_shape(cfg.engine.model)
    fill = fill if fill is not None else o.admission.fill
    shape = shape or DialogueShape()
    engines = int(o.num_engines)
    this = plan_engine(model, GPUS[gpu_name], tp=int(o.tensor_parallel_size),
                       gpu_memory_utilization=float(o.gpu_memory_utilization), kv_cache_dtype=o.kv_cache_dtype,
                       fill=fill, shape=shape, max_model_len=int(o.max_model_len))
    options = [plan_engine(model, GPUS[gpu_name], tp=tp, gpu_memory_utilization=float(o.gpu_memory_utilization),
                           kv_cache_dtype=kv, fill=fill, shape=shape)
               for tp in (1, 2, 4, 8) for kv in ("auto", "fp8_e4m3")]
    options = [p for p in options if p["fits"]]
    per_engine = this["dialogues_in_flight"]
    configured = math.ceil(cfg.synth.in_flight / engines)
    return {
        "engine": this,
        "num_engines": engines,
        "synth_in_flight": {"configured": cfg.synth.in_flight, "configured_per_engine": configured,
                            "recommended": per_engine * engines, "recommended_per_engine": per_engine,
                            "fits": this["fits"] and configured <= per_engine},
        "max_num_seqs": {"configured": int(o.max_num_seqs), "recommended_at_least": per_engine},
        "cluster_dialogues_per_hour": [engines * x for x in this["dialogues_per_hour"]],
        "options": [{k: p[k] for k in ("tensor_parallel_size", "kv_cache_dtype", "kv_tokens_per_engine",
                                       "dialogues_in_flight", "dialogues_per_hour_per_gpu")} for p in options],
    }


def plan_pools(cfg: Any, gpu_name: str | None = None, fill: float | None = None,
               shape: DialogueShape | None = None) -> dict[str, Any]:
    """Every engine of the config: one plan for ``engine:``, one per named vLLM engine of ``engines:``
    (each sized for the prompt views its roles keep: a tool role on another engine than the doctor
    holds the doctor's view there too)."""
    shape = shape or DialogueShape()
    if not getattr(cfg, "engines", None):
        return {"engine": plan_config(cfg, gpu_name, fill, shape)}
    rm = cfg.role_map()
    out: dict[str, Any] = {}
    for name, ecfg in cfg.engines.items():
        if ecfg.name != "vllm":
            out[name] = {"skipped": f"engines.{name} is {ecfg.name!r}: nothing to size"}
            continue
        roles = tuple(r for r, opts in rm.choices if any(n == name for n, _ in opts))
        if "default" in roles:
            listed = {r for r, _ in rm.choices}
            roles = tuple(r for r in roles if r != "default") + tuple(
                r for r in ("doctor", "patient", "tool", "companion") if r not in listed)
        one = cfg.model_copy(update={"engine": ecfg, "engines": None, "roles": None})
        out[name] = {"roles": list(roles), **plan_config(one, gpu_name, fill, replace(shape, roles=roles))}
    return out


def render(p: dict[str, Any]) -> str:
    e, d = p["engine"], p["engine"]["dialogue"]
    s = p["synth_in_flight"]
    lines = [
        f"model {e['model']} on {e['gpu']} (TP {e['tensor_parallel_size']}, KV cache {e['kv_cache_dtype']}, "
        f"gpu_memory_utilization {e['gpu_memory_utilization']})",
        f"  KV bytes per token           {e['kv_bytes_per_token']:,}",
        f"  weights per GPU              {e['weights_gb_per_gpu']} GB; KV cache per GPU {e['kv_gb_per_gpu']} GB",
        f"  KV tokens per engine         {e['kv_tokens_per_engine']:,}",
        f"  tokens per dialogue          {d['peak_tokens']:,} at its end, {d['mean_tokens']:,} averaged over its life "
        f"({d['exchanges']} exchanges, {d['doctor_turn']}/{d['patient_turn']}-token turns)",
        f"  dialogues in flight / engine {e['dialogues_in_flight']} (fill {e['fill']}); "
        f"{e['dialogues_at_peak']} if all were at their end",
        f"  output tok/s / engine        {e['output_tok_s'][0]:,}-{e['output_tok_s'][1]:,} ({e['throughput_kind']})",
        f"  dialogues / hour / engine    {e['dialogues_per_hour'][0]:,}-{e['dialogues_per_hour'][1]:,}; "
        f"cluster of {p['num_engines']}: {p['cluster_dialogues_per_hour'][0]:,}-{p['cluster_dialogues_per_hour'][1]:,}",
        f"synth.in_flight: configured {s['configured']} ({s['configured_per_engine']} per engine), "
        f"recommended {s['recommended']} ({s['recommended_per_engine']} per engine): "
        + ("fits" if s["fits"] else "DOES NOT FIT: the prefix cache would evict"),
        f"engine.vllm.max_num_seqs: configured {p['max_num_seqs']['configured']}, "
        f"at least {p['max_num_seqs']['recommended_at_least']}",
    ]
    if "max_model_len_ok" in e:
        lines.append(f"engine.vllm.max_model_len: the longest prompt is about {e['longest_prompt_tokens']:,} tokens: "
                     + ("fits" if e["max_model_len_ok"] else "TOO SHORT"))
    lines.append("layouts on this GPU (TP, KV dtype: dialogues in flight per engine, dialogues/hour per GPU):")
    for o in p["options"]:
        lines.append(f"  TP {o['tensor_parallel_size']}, {o['kv_cache_dtype']:<9} {o['dialogues_in_flight']:>5}   "
                     f"{o['dialogues_per_hour_per_gpu'][0]:,}-{o['dialogues_per_hour_per_gpu'][1]:,}")
    return "\n".join(lines)
