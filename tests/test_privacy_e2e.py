"""Property: personal data given in any form, anywhere in a case, never reaches an output file or the log.

Hypothesis writes personal data (mobile, landline, ID, bank card, e-mail, QQ, WeChat, record numbers;
half- and full-width, Chinese numerals, separators, +86) into case ids, free-text fields, sub-field
names, wrong fields and unknown fields; the main job (`jobs.run`, scripted engine) synthesizes and
evaluates; every file under OUT (Parquet decoded, JSON, text, binary) and the job's whole output are
scanned with digits, width and separators normalised.
"""
from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pyarrow.parquet as pq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mdd import privacy
from pii_forms import Datum, datum, leaks

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "data" / "cases" / "sample_cases.json"
N_CASES = 8


def output_text(out: Path) -> dict[str, str]:
    """Every file under ``out`` as text: Parquet decoded row by row, anything else as UTF-8."""
    texts = {}
    for f in sorted(p for p in out.rglob("*") if p.is_file()):
        if f.suffix == ".parquet":
            t = pq.read_table(f)
            texts[str(f)] = json.dumps(t.to_pylist(), ensure_ascii=False, default=str) + json.dumps(
                {k.decode(errors="replace"): v.decode(errors="replace") for k, v in (t.schema.metadata or {}).items()},
                ensure_ascii=False)
        else:
            texts[str(f)] = f.read_bytes().decode("utf-8", errors="replace")
    return texts


def run_main_job(src: Path, out: Path, env: dict[str, str]) -> dict[str, str]:
    """``jobs.run`` (scripted engine, one variant) on ``src`` into ``out``: every output file as text
    (``output_text``) and the job's stdout and stderr."""
    proc = subprocess.run([sys.executable, "-m", "jobs.run", "--config", "configs/local.yaml", "--cases", str(src),
                           "--out", str(out), "--variants", "1", "--no-progress"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    texts = output_text(out)
    texts["<stdout>"], texts["<stderr>"] = proc.stdout, proc.stderr
    return texts


@st.composite
def hostile_cases(draw) -> tuple[list, list[Datum]]:
    base = json.loads(SAMPLES.read_text(encoding="utf-8"))
    data: list[Datum] = []

    def put() -> str:
        d = draw(datum)
        data.append(d)
        return d.text

    cases = []
    for i in range(N_CASES):
        c = copy.deepcopy(base[i])
        c["患者"] = put() if i % 2 == 0 else f"P{i:02d}"  # personal ids on every other case
        c["主诉"] = c["主诉"] + "，" + put()
        c["现病史"] = put() + c["现病史"] + "联系" + put() + "。"
        c["家族史"] = (c.get("家族史") or "无") + put()
        if isinstance(c.get("个人史"), dict):
            c["个人史"]["联系方式"] = put()
            c["个人史"]["家属" + put()] = "父亲"  # personal data in a sub-field's name
        c["紧急联系人"] = put()  # an unknown field
        cases.append(c)
    for field in ("性别", "年龄", "ICD编码", "主诉"):  # wrong fields: these cases are rejected
        c = copy.deepcopy(base[N_CASES])
        c["患者"] = put()
        c[field] = put() if field != "主诉" else 13812345678
        cases.append(c)
    return cases, data


# one example (about 60 data in 12 cases) per run: each runs the whole job; the pattern set's own
# property tests in test_privacy.py run hundreds of examples
@settings(max_examples=1, deadline=None, suppress_health_check=list(HealthCheck))
@given(hostile_cases())
def test_no_personal_datum_reaches_any_output_or_the_log(generated):
    cases, data = generated
    data.append(Datum("mobile", "13812345678", "13812345678"))
    broken = Datum("mobile", "139-8765-4321", "13987654321")  # in a JSONL line that is not JSON
    data.append(broken)
    with tempfile.TemporaryDirectory() as tmp:
        src, out = Path(tmp) / "cases", Path(tmp) / "out"
        src.mkdir()
        (src / "a.json").write_text(json.dumps(cases, ensure_ascii=False), encoding="utf-8")
        (src / "b.jsonl").write_text('{"患者": "' + broken.text + '", "主诉": \n', encoding="utf-8")
        inputs = "".join(f.read_text(encoding="utf-8") for f in sorted(src.iterdir()))
        assert leaks(inputs, data) == data  # control: the scanner finds every datum in the input
        env = {**os.environ, "RAY_ADDRESS": ""}
        env.pop("MDD_PRIVACY_KEY", None)
        texts = run_main_job(src, out, env)
        found = {name: [d.text for d in leaks(t, data)] for name, t in texts.items()}
        assert {k: v for k, v in found.items() if v} == {}

        # the data went through the pipeline: dialogues, evaluation and rejects exist and show the masks
        ids = {privacy.Deidentifier(b"any").case_id(c["患者"])[0] for c in cases[:N_CASES]}  # generated ids may repeat
        assert pq.read_table(out / "synth").num_rows == len(ids)
        assert pq.read_table(out / "eval" / "turns").num_rows > 0
        rejects = pq.read_table(out / "rejects.parquet").to_pylist()
        assert len(rejects) >= 5 and {"(line)"} <= {r["field"] for r in rejects}
        synth = texts[next(k for k in texts if "/synth/" in k)]
        assert "已隐去]" in synth
        run = json.loads((out / "run.json").read_text(encoding="utf-8"))["synthesize"]
        masked = run["personal_data_masked"]
        assert sum(k.startswith("anon-") for k in masked) == sum(i.startswith("anon-") for i in ids)
        assert all(":" in m for v in masked.values() for m in v)


def test_hostile_case_text_in_a_nested_folder_reaches_no_output():
    """The labelled forms of tests/privacy_probe.py (HOSTILE, HELD_OUT, HELD_OUT_2: names with titles, pinyin names,
    administrative chains, estates, schools, employers, units, URLs, postcodes, dates in every form, ages
    in Chinese numerals) written into the sample cases' free text, in a cases folder with a subfolder and
    a file of another extension: the main job runs; no mention of 3+ characters is in any file under OUT
    or in the job's output; every age is in tens; the other file is a reject row."""
    from privacy_probe import HELD_OUT, HELD_OUT_2, HOSTILE

    base = json.loads(SAMPLES.read_text(encoding="utf-8"))
    probes = HOSTILE + HELD_OUT + HELD_OUT_2
    cases = [copy.deepcopy(c) for c in base[:N_CASES]]
    for i, (text, _) in enumerate(probes):
        c = cases[i % N_CASES]
        if i % 3 == 0 and isinstance(c.get("个人史"), dict):
            c["个人史"][f"补充{i}"] = text
        else:
            c["现病史"] = c["现病史"] + text
    # (3+ characters; not a short run of digits such as 5/12 or 5.12, which a count in the job's output can hold)
    mentions = sorted({m for _, ms in probes for m, kind in ms
                       if len(m) >= 3 and kind != "age" and not re.fullmatch(r"[0-9./]{1,5}", m)})
    with tempfile.TemporaryDirectory() as tmp:
        src, out = Path(tmp) / "cases", Path(tmp) / "out"
        (src / "part" / "b").mkdir(parents=True)
        (src / "cases.json").write_text(json.dumps(cases[:4], ensure_ascii=False), encoding="utf-8")
        (src / "part" / "b" / "cases.jsonl").write_text(
            "\n".join(json.dumps(c, ensure_ascii=False) for c in cases[4:]), encoding="utf-8")
        (src / "part" / "张伟的病历.txt").write_text(probes[0][0], encoding="utf-8")
        inputs = json.dumps(cases, ensure_ascii=False)
        assert all(m in inputs for m in mentions) and len(mentions) >= 120  # control
        texts = run_main_job(src, out, {**os.environ, "RAY_ADDRESS": ""})
        found = {name: [m for m in mentions if m in t] for name, t in texts.items()}
        assert {k: v for k, v in found.items() if v} == {}
        assert pq.read_table(out / "synth").num_rows == N_CASES
        for table, col in (("cases.parquet", "age"), ("synth", "age")):
            ages = pq.read_table(out / table).column(col).to_pylist()
            assert ages and all(a % 10 == 0 for a in ages), (table, ages)
        rejects = pq.read_table(out / "rejects.parquet").to_pylist()
        other = [r for r in rejects if r["field"] == "(file)"]
        assert len(other) == 1 and "extension '.txt'" in other[0]["reason"] and "张伟" not in other[0]["source"]
        assert "not a case file" in texts["<stderr>"]
