"""The publish stage on a real main-job run: the report in headless Chromium, the dataset card through
``datasets.load_dataset``, the SFT / ShareGPT exports."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
MDD5K = ROOT.parent / "shared" / "mdd5k"
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@pytest.fixture(scope="module")
def run(main_run):
    """The main job's output (conftest: 6 sample cases x 2 variants, the second of two rounds)."""
    return main_run


def chromium(*args: str, tmp: Path) -> subprocess.CompletedProcess:
    exe = shutil.which("chromium")
    assert exe, "chromium is not installed: scripts/setup.sh installs it (apt-get install chromium)"
    profile = tmp / f"profile-{len(list(tmp.glob('profile-*')))}"
    return subprocess.run([exe, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args], capture_output=True,
                          text=True, timeout=120)


def test_main_job_writes_report_figures_and_card(run):
    rep = json.loads((run / "run.json").read_text(encoding="utf-8"))["report"]
    assert all(v == "ok" for v in rep["panels"].values()), rep["panels"]
    pngs = sorted(p.name for p in (run / "report").glob("*.png"))
    assert [f"report/{p}" for p in pngs] == sorted(rep["figures"]) and len(pngs) >= 8
    for p in pngs:
        assert (run / "report" / p).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = (run / "report.html").read_text(encoding="utf-8")
    # self-contained: every image inline, nothing fetched from anywhere
    assert page.count("<img ") == len(pngs) == page.count("src='data:image/png;base64,")
    assert not re.search(r"""(src|href)=['"]?(https?:|//)""", page)
    assert (run / "README.md").is_file()
    h = rep["headline"]
    synth = pq.read_table(run / "synth")
    assert h["dialogues"] == synth.num_rows == 12
    assert h["exchanges_mean"] == pytest.approx(np.mean(synth.column("n_exchanges").to_numpy()), abs=0.01)
    assert h["reference"]["exchanges_mean"] == 23.2 and h["reference"]["chars_per_turn_mean"] == {"doctor": 99, "patient": 131}


def test_report_renders_in_headless_chromium_with_every_image_loaded(run, tmp_path):
    url = (run / "report.html").resolve().as_uri()
    dom = chromium("--virtual-time-budget=10000", "--dump-dom", url, tmp=tmp_path)
    body = re.search(r"<body[^>]*>", dom.stdout)
    assert body, dom.stderr[-2000:]
    images = int(re.search(r'data-images="(\d+)"', body.group(0)).group(1))
    loaded = int(re.search(r'data-images-loaded="(\d+)"', body.group(0)).group(1))
    n_png = len(list((run / "report").glob("*.png")))
    assert images == loaded == n_png
    # a broken image is counted as not loaded: the same check on a copy with one image cut short
    broken = tmp_path / "broken.html"
    page = (run / "report.html").read_text(encoding="utf-8")
    broken.write_text(page.replace("src='data:image/png;base64,iVBOR", "src='data:image/png;base64,AAAA", 1),
                      encoding="utf-8")
    dom2 = chromium("--virtual-time-budget=10000", "--dump-dom", broken.as_uri(), tmp=tmp_path)
    assert f'data-images-loaded="{n_png - 1}"' in dom2.stdout
    # and a screenshot shows a page with figures on it (not blank)
    shot = tmp_path / "report.png"
    chromium(f"--screenshot={shot}", "--window-size=1280,3000", url, tmp=tmp_path)
    from PIL import Image

    img = np.asarray(Image.open(shot).convert("RGB"))
    assert img.shape[:2] == (3000, 1280)
    blue = np.all(np.abs(img.astype(int) - [47, 109, 181]) < 40, axis=-1).mean()  # the bars' colour
    assert blue > 0.005 and (img < 250).any(axis=-1).mean() > 0.05


def test_reference_figures_computed_from_a_corpus(run, tmp_path):
    """--reference: the figures come from the corpus (checked against the raw MDD-5k files)."""
    from jobs.import_mdd5k import main as import_main
    from jobs.report import main as report_main

    ref, run = tmp_path / "mdd5k", shutil.copytree(run, tmp_path / "run", ignore=shutil.ignore_patterns("report*"))
    assert import_main(["--dialogues", str(MDD5K / "dialogues"), "--labels", str(MDD5K / "labels"),
                        "--out", str(ref)]) == 0
    assert report_main(["--out", str(run), "--reference", str(ref)]) == 0
    exchanges, doc, pat = [], [], []
    for f in sorted((MDD5K / "dialogues").glob("patient_*.json")):
        for d in json.loads(f.read_text(encoding="utf-8")):
            conv = d["conversation"]
            exchanges.append(sum(1 for x in conv if (x.get("doctor") or "").strip() and (x.get("patient") or "").strip()))
            doc += [len(x["doctor"].strip()) for x in conv if (x.get("doctor") or "").strip()]
            pat += [len(x["patient"].strip()) for x in conv if (x.get("patient") or "").strip()]
    h = json.loads((run / "run.json").read_text(encoding="utf-8"))["report"]["headline"]["reference"]
    assert h["exchanges_mean"] == pytest.approx(np.mean(exchanges), abs=0.01)
    assert h["chars_per_turn_mean"]["doctor"] == pytest.approx(np.mean(doc), abs=0.05)
    assert h["chars_per_turn_mean"]["patient"] == pytest.approx(np.mean(pat), abs=0.05)
    assert "reference" in h["label"] and len(exchanges) == 100
    assert report_main(["--out", str(run), "--reference", str(tmp_path / "nothing")]) == 2


def test_report_says_not_available_and_survives_a_broken_panel(tmp_path, monkeypatch):
    """A run with dialogues only (no evaluation, no run.json): those panels say so; a panel that raises
    is shown with its error and the rest is still written."""
    from mdd.publish import report

    out = tmp_path / "bare"
    turns = [{"speaker": "doctor", "text": "你好，最近睡得怎么样？", "topic": "睡眠"},
             {"speaker": "patient", "text": "睡不好。", "topic": "睡眠"},
             {"speaker": "companion", "text": "她晚上老醒。", "topic": "睡眠"},
             {"speaker": "doctor", "text": "诊断结束。", "topic": "诊断结果"}]
    from mdd.storage import write_table

    write_table(pa.Table.from_pylist([{"dialogue_id": "x-v0", "case_id": "x", "turns": turns, "icd_code": "F32.1",
                                       "topics": ["睡眠"]}]), out / "synth" / "part-a.parquet")

    def broken(ctx):
        raise KeyError("boom")

    monkeypatch.setattr(report, "PANELS", report.PANELS + [("broken", "Broken", broken)])
    s = report.build_report(out)
    assert s["panels"]["metrics"].startswith("not available") and s["panels"]["rules"].startswith("not available")
    assert s["panels"]["cost"].startswith("not available") and s["panels"]["broken"].startswith("error: KeyError")
    assert s["panels"]["shape"] == s["panels"]["cases"] == "ok"
    page = (out / "report.html").read_text(encoding="utf-8")
    assert page.count("Not available:") >= 3 and "This panel failed: KeyError" in page
    assert "Dialogues with companion turns: 1 of 1" in page


def test_card_header_and_load_dataset(run, tmp_path, monkeypatch):
    text = (run / "README.md").read_text(encoding="utf-8")
    assert text.startswith("---\n")
    meta = yaml.safe_load(text.split("---\n")[1])
    assert meta["language"] == ["zh"] and meta["license"] == "apache-2.0" and meta["size_categories"] == ["n<1K"]
    names = [c["config_name"] for c in meta["configs"]]
    assert names[:4] == ["dialogues", "turns", "rules", "dialogue_scores"] and meta["configs"][0]["default"]
    for section in ("## Schema", "## How it was made", "## Figures", "## Known limitations", "## Loading"):
        assert section in text
    assert "scripted" in text.split("## Known limitations")[1]

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    import datasets

    ds = datasets.load_dataset(str(run))["train"]
    synth = pq.read_table(run / "synth")
    assert ds.num_rows == synth.num_rows and sorted(ds["dialogue_id"]) == sorted(synth.column("dialogue_id").to_pylist())
    assert ds[0]["turns"][0]["speaker"] == "doctor"
    turns = datasets.load_dataset(str(run), "turns")["train"]
    assert turns.num_rows == pq.read_table(run / "eval" / "turns").num_rows
    # the features in the header are what datasets itself derives from the files
    info = {d["config_name"]: d["features"] for d in meta["dataset_info"]}
    assert info["dialogues"] == datasets.Features.from_arrow_schema(synth.schema)._to_yaml_list()


def test_hf_features_match_datasets_and_refuse_maps():
    import datasets

    from mdd.publish.card import hf_feature
    from mdd.schema import DIALOGUE, SFT_ROW, TURN_EVAL

    for schema in (DIALOGUE, TURN_EVAL, SFT_ROW):
        ours = [dict(name=f.name, **hf_feature(f.type)) for f in schema]
        assert ours == datasets.Features.from_arrow_schema(schema)._to_yaml_list()
    with pytest.raises(TypeError, match="map"):
        hf_feature(pa.map_(pa.string(), pa.string()))


def _check_chat(messages: list[dict], diagnosis: str) -> None:
    assert messages[0]["role"] == "system" and messages[0]["content"]
    roles = [m["role"] for m in messages[1:]]
    assert roles[0] == "user" and roles[-1] == "assistant"
    assert all(a != b for a, b in zip(roles, roles[1:])), roles  # strictly alternating
    assert set(roles) == {"user", "assistant"}
    assert all(isinstance(m["content"], str) and m["content"].strip() for m in messages)
    assert diagnosis in messages[-1]["content"] and "诊断" in messages[-1]["content"]


def test_sft_export_rows_are_chat_messages_and_deterministic(run):
    from jobs.export import main as export_main

    assert export_main(["--out", str(run), "--format", "sft"]) == 0
    table = pq.read_table(run / "export" / "sft")
    first = (run / "export" / "sft.jsonl").read_bytes()
    synth = {r["dialogue_id"]: r for r in pq.read_table(run / "synth").to_pylist()}
    assert table.num_rows == len(synth)
    rows = [json.loads(line) for line in first.decode("utf-8").splitlines()]
    assert [r["dialogue_id"] for r in rows] == sorted(synth) == table.column("dialogue_id").to_pylist()
    for r in rows:
        _check_chat(r["messages"], synth[r["dialogue_id"]]["diagnosis"])
        doctor = [t["text"] for t in synth[r["dialogue_id"]]["turns"] if t["speaker"] == "doctor"]
        assert [m["content"] for m in r["messages"] if m["role"] == "assistant"] == doctor
        assert all(m["weight"] == 1 for m in r["messages"] if m["role"] == "assistant")
        assert all("weight" not in m for m in r["messages"] if m["role"] != "assistant")
    assert table.to_pylist()[0]["messages"][2]["content"] == rows[0]["messages"][2]["content"]
    assert export_main(["--out", str(run), "--format", "sft"]) == 0
    assert (run / "export" / "sft.jsonl").read_bytes() == first
    card = (run / "README.md").read_text(encoding="utf-8")
    assert "config_name: sft" in card and "## Fine-tuning export" in card


def test_a_new_export_format_is_one_entry(run, monkeypatch):
    """An output format is added in one place: an ExportFormat in mdd.publish.export.FORMATS (name, row schema,
    the shape of its columns); the command line, the Parquet and JSONL writers take it from there."""
    import pyarrow as pa

    from jobs.export import main as export_main
    from mdd.publish import export as E

    base = [pa.field(n, pa.string()) for n in ("dialogue_id", "case_id", "icd_code", "diagnosis")]
    plain = E.ExportFormat("plain", pa.schema(base + [pa.field("quality", pa.float64()), pa.field("text", pa.string())]),
                           lambda msgs: {"text": "\n".join(f"{m['role']}: {m['content']}" for m in msgs[1:])})
    monkeypatch.setitem(E.FORMATS, "plain", plain)
    assert export_main(["--out", str(run), "--format", "plain"]) == 0
    rows = [json.loads(line) for line in (run / "export" / "plain.jsonl").read_text(encoding="utf-8").splitlines()]
    assert rows and all(r["text"].startswith("user: ") and "assistant: " in r["text"] for r in rows)
    assert pq.read_table(run / "export" / "plain").num_rows == len(rows)


def test_export_filters_follow_the_evaluation(run):
    from jobs.export import main as export_main

    dial = pq.read_table(run / "eval" / "dialogues").to_pylist()
    q = float(np.median([d["overall"] for d in dial]))
    assert export_main(["--out", str(run), "--format", "sharegpt", "--min-quality", str(q),
                        "--mask-below", "0.45"]) == 0
    rows = pq.read_table(run / "export" / "sharegpt").to_pylist()
    assert sorted(r["dialogue_id"] for r in rows) == sorted(d["dialogue_id"] for d in dial if d["overall"] >= q)
    assert 0 < len(rows) < len(dial)
    te = pq.read_table(run / "eval" / "turns").to_pylist()
    low = {(t["dialogue_id"], t["question"]) for t in te if t["doctor_quality"] < 0.45}
    high = {(t["dialogue_id"], t["question"]) for t in te if t["doctor_quality"] >= 0.45}
    masked = 0
    for r in rows:
        assert r["system"] and [c["from"] for c in r["conversations"]][:2] == ["human", "gpt"]
        for c in r["conversations"]:
            if c["from"] == "gpt" and (r["dialogue_id"], c["value"]) in low - high:
                assert c["weight"] == 0
                masked += 1
            elif c["from"] == "gpt" and (r["dialogue_id"], c["value"]) in high - low:
                assert c["weight"] == 1
        assert r["conversations"][-1]["weight"] == 1  # the diagnosis is always trained on
    assert masked > 0
    summary = json.loads((run / "run.json").read_text(encoding="utf-8"))["export"]["sharegpt"]
    assert summary["rows"] == len(rows) and summary["dropped"] == {f"overall < {q}": len(dial) - len(rows)}
    assert export_main(["--out", str(run), "--format", "sft", "--metric", "nope", "--min-quality", "0.5"]) == 2


def test_companion_turns_become_labelled_user_messages():
    from mdd.publish.export import to_messages

    turns = [{"speaker": "doctor", "text": "你好，哪里不舒服？"},
             {"speaker": "patient", "text": "睡不好。"},
             {"speaker": "companion", "text": "她晚上老醒。", "relation": "母亲"},
             {"speaker": "doctor", "text": "多久了？"},
             {"speaker": "doctor", "text": "白天困吗？"},
             {"speaker": "companion", "text": "三个月了。"},
             {"speaker": "patient", "text": ""},
             {"speaker": "doctor", "text": "诊断结束：失眠。"}]
    msgs = to_messages(turns, weights={3: 0, 4: 0})
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user", "assistant", "user", "assistant"]
    assert msgs[3]["content"] == "患者：睡不好。\n家属（母亲）：她晚上老醒。"
    assert msgs[4] == {"role": "assistant", "content": "多久了？\n白天困吗？", "weight": 0}
    assert msgs[5]["content"] == "家属：三个月了。"
    assert msgs[6]["weight"] == 1 and msgs[6]["content"] == "诊断结束：失眠。"
    # a dialogue that opens with the patient joins the stage cue; roles still alternate
    msgs2 = to_messages([{"speaker": "patient", "text": "医生好。"}, {"speaker": "doctor", "text": "请坐。"}])
    assert [m["role"] for m in msgs2] == ["system", "user", "assistant"] and msgs2[1]["content"].endswith("医生好。")
