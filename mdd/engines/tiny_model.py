"""A tiny random-weight Qwen2 model for running the real vLLM engine without downloads.

``build_tiny_model(path)`` trains a small character-level BPE tokenizer on local text (the
knowledge YAML/JSON and the case files when present, plus a built-in Chinese+ASCII corpus
with a spread of CJK characters; rarer characters become ``<|unk|>``). Not byte-level on purpose: a random model's
output then always decodes to whole characters, so the text it writes re-encodes to about
as many tokens as it generated, and dialogue histories do not balloon (byte-level noise
decodes to replacement characters that re-encode to three tokens each). It
wraps it in a ``PreTrainedTokenizerFast`` with Qwen's chat specials and template, builds a
``Qwen2Config`` (hidden 128, 2 heads, 1 KV head: head_dim 64, which the CPU attention
kernels accept) with seeded random weights, and saves both into one folder.

The build is idempotent and safe under concurrency: it writes into a temporary sibling
directory and renames it into place; a caller that loses the race uses the winner's copy.

Model strings: ``tiny`` means ``.cache/models/mdd-tiny`` under the current directory,
``tiny:<dir>`` means ``<dir>``; :func:`resolve_model` turns either into a built path.
"""
from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import cast

DEFAULT_DIR = Path(".cache") / "models" / "mdd-tiny"
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|unk|>")
# A small vocabulary on purpose: sampling and penalties pass over it for every token, and on a
# CPU that costs more than the tiny model itself.
VOCAB_SIZE = 8000
_MARKER = "mdd_tiny.ok"
_BUILDER_VERSION = "3"  # bump when the build changes: older builds are rebuilt

# Qwen2.5-style template (no tool support): default system prompt when none is given.
CHAT_TEMPLATE = (
    "{%- if messages and messages[0]['role'] == 'system' -%}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' -}}"
    "{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}"
    "{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' -}}"
    "{%- set loop_messages = messages -%}"
    "{%- endif -%}"
    "{%- for message in loop_messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

_BUILTIN_CORPUS = """
医生：你好，请问你今天哪里不舒服？最近睡眠怎么样？有没有情绪低落、兴趣减退的情况？
患者：医生你好，我最近两个月总是睡不着，早上醒得很早，醒了就再也睡不着了。
医生：这种情况持续多久了？白天精神怎么样？有没有觉得做什么事情都提不起劲？
患者：大概两个月吧，白天很累，注意力不集中，工作效率很低，对以前喜欢的事情也没兴趣了。
医生：有没有想过伤害自己，或者觉得活着没有意思？
患者：有时候会觉得活着很累，但是没有真的想过要伤害自己。
医生：你的食欲和体重有没有变化？有没有心慌、胸闷、手抖、出汗这些症状？
患者：吃得比以前少，瘦了五六斤。紧张的时候会心慌，手心出汗，总是担心会发生不好的事情。
医生：家里人有没有类似的情况？以前有没有看过精神科或者心理科？
患者：我妈妈以前有过抑郁症，吃过药。我自己是第一次来看病。
诊断：抑郁发作，焦虑障碍，双相情感障碍，强迫症，失眠障碍，精神分裂症，创伤后应激障碍。
症状：情绪低落，兴趣减退，精力下降，睡眠障碍，食欲减退，自责自罪，注意力下降，自杀观念。
主诉 现病史 既往史 个人史 家族史 精神检查 体格检查 辅助检查 初步诊断 治疗计划 随访
是 否 有 没有 不知道 可能 经常 偶尔 从不 总是 一点 很多 轻度 中度 重度
The doctor asks about sleep, mood, appetite, energy, concentration and thoughts of self-harm.
The patient describes low mood, poor sleep and worry. {"topic": "sleep", "end": true, "score": 0.5}
Yes No maybe 0123456789 ,.;:!?()[]{}<>"'-_=+*/\\|@#$%^&~`
"""


def _synthetic_corpus(seed: int = 0, n_chars: int = 3000, n_words: int = 30000) -> str:
    """Deterministic filler so the vocabulary reaches a few thousand tokens without any data:
    the built-in corpus's characters plus a slice of the CJK block, strung into pseudo-words."""
    import random

    rng = random.Random(seed)
    pool = sorted({c for c in _BUILTIN_CORPUS if not c.isspace()})
    pool += [chr(0x4E00 + i) for i in range(0, 0x51A5, max(1, 0x51A5 // n_chars))]
    ascii_words = [w for w in re.findall(r"[A-Za-z]+", _BUILTIN_CORPUS)]
    out: list[str] = []
    for _ in range(n_words):
        if rng.random() < 0.15 and ascii_words:
            out.append(" " + rng.choice(ascii_words).lower())
        else:
            out.append("".join(rng.choice(pool) for _ in range(rng.randint(1, 3))))
    return "".join(out)


def _local_texts() -> list[str]:
    """Text to train the tokenizer on: knowledge files, case files, the built-in corpus."""
    texts = [_BUILTIN_CORPUS] * 4 + [_synthetic_corpus()]
    pkg = Path(__file__).resolve().parent.parent
    roots = [pkg / "knowledge", pkg.parent / "data" / "cases", Path.cwd() / "data" / "cases"]
    seen: set[Path] = set()
    budget = 4_000_000  # characters: enough for a few-thousand-token vocabulary
    for root in roots:
        if not root.is_dir():
            continue
        for p in sorted(root.rglob("*")):
            if p.suffix.lower() not in {".yaml", ".yml", ".json", ".jsonl", ".txt"} or not p.is_file():
                continue
            rp = p.resolve()
            if rp in seen:
                continue
            seen.add(rp)
            try:
                t = p.read_text(encoding="utf-8", errors="ignore")
            except OSError:
                continue
            texts.append(t[:budget])
            budget -= len(texts[-1])
            if budget <= 0:
                return texts
    return texts


def _is_built(path: Path) -> bool:
    marker = path / _MARKER
    return marker.is_file() and f"builder={_BUILDER_VERSION}" in marker.read_text(encoding="utf-8")


def _build_into(out: Path, seed: int) -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    tok = Tokenizer(models.BPE(unk_token="<|unk|>"))
    tok.pre_tokenizer = pre_tokenizers.Punctuation(behavior="isolated")
    tok.decoder = decoders.Fuse()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=[chr(c) for c in range(32, 127)] + ["\n", "\t"],
        show_progress=False,
    )
    tok.train_from_iterator(_local_texts(), trainer=trainer)

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=None,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token="<|unk|>",
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
        model_max_length=8192,
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHAT_TEMPLATE
    # in its own folder: AutoTokenizer picks the class by the model folder's model_type (qwen2)
    # and would rebuild a byte-level tokenizer; the engine passes this folder as `tokenizer`
    fast.save_pretrained(str(out / "tokenizer"))

    vocab = len(fast)
    vocab_padded = ((vocab + 63) // 64) * 64
    # transformers' hints name only the declared parameters; the config keeps other keys (head_dim,
    # rope_theta, torch_dtype) as attributes, and the built model reads them
    cfg = Qwen2Config(  # type: ignore[call-arg]
        vocab_size=vocab_padded,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        max_position_embeddings=8192,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        bos_token_id=cast(int, fast.convert_tokens_to_ids("<|endoftext|>")),  # one token in: one id out
        eos_token_id=fast.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=cast(int, fast.convert_tokens_to_ids("<|endoftext|>")),
        torch_dtype="float32",
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(cfg)
    model.eval()
    model.save_pretrained(str(out), safe_serialization=True)
    try:  # generation_config.json is optional; keep eos consistent if it was written
        model.generation_config.eos_token_id = cfg.eos_token_id
        model.generation_config.save_pretrained(str(out))
    except Exception:  # pragma: no cover - cosmetic
        pass
    (out / _MARKER).write_text(f"builder={_BUILDER_VERSION} seed={seed} vocab={vocab}\n", encoding="utf-8")


def build_tiny_model(path: str | os.PathLike = DEFAULT_DIR, seed: int = 0) -> Path:
    """Build the tiny model into ``path`` unless it is already there; return the absolute path."""
    path = Path(path).expanduser().resolve()
    if _is_built(path):
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    try:
        os.chmod(tmp, 0o755)
        _build_into(tmp, seed)
        try:
            os.rename(tmp, path)  # atomic on one filesystem; fails if path exists and is non-empty
        except OSError:
            if not _is_built(path):  # an empty folder or an outdated build: move it aside, then replace
                old = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".old", dir=path.parent))
                os.rename(path, old / path.name)
                os.rename(tmp, path)
                shutil.rmtree(old, ignore_errors=True)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    if not _is_built(path):
        raise RuntimeError(f"tiny model: build into {path} did not complete")
    return path


def is_tiny(model: str) -> bool:
    return model == "tiny" or model.startswith("tiny:")


def resolve_model(model: str) -> str:
    """``tiny`` / ``tiny:<dir>`` → a built local folder; a model of the registry (``mdd/models``) → its
    fetched folder; anything else is returned unchanged."""
    if not is_tiny(model):
        from mdd import models

        try:
            return models.resolve(model)
        except models.ModelError as exc:
            from mdd.engines.base import EngineError

            raise EngineError(str(exc)) from None
    _, _, d = model.partition(":")
    return str(build_tiny_model(Path(d) if d else Path.cwd() / DEFAULT_DIR))
