"""How the speakers sound, measured: the jargon detector, repeated doctor openers, turn lengths.
Baselines on the 100 MDD-5k dialogues in ../shared/mdd5k, imported as jobs.import_mdd5k does."""
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from jobs.import_mdd5k import main as import_main
from mdd.record.speech import SpeechTally, jargon_in, length_stats, opener, repeated_openers, uses_jargon

MDD5K = Path(__file__).resolve().parents[1].parent / "shared" / "mdd5k"


@pytest.fixture(scope="module")
def mdd5k_rows(tmp_path_factory):
    out = tmp_path_factory.mktemp("mdd5k")
    assert import_main(["--dialogues", str(MDD5K / "dialogues"), "--labels", str(MDD5K / "labels"),
                        "--out", str(out)]) == 0
    rows = pq.read_table(out / "synth").to_pylist()
    assert len(rows) == 100
    return rows


def test_jargon_detector_known_answers():
    assert uses_jargon("我最近情绪低落，兴趣减退") and jargon_in("医生说我是抑郁症") == ["抑郁症"]
    assert not uses_jargon("最近心情一直不好，以前喜欢的事都提不起劲，天不亮就醒")
    turns = [{"speaker": "doctor", "text": "有没有幻听？"}, {"speaker": "patient", "text": "没有幻听。"},
             {"speaker": "patient", "text": "就是睡不好。"}]
    from mdd.record.speech import jargon_turns
    assert jargon_turns(turns) == 1  # the doctor's words are not the patient's


def test_mdd5k_baseline_figures(mdd5k_rows):
    """The released corpus: 18% of patient turns use jargon (the figure the README cites; FACTS.md
    measured about 12.5% on a 500-dialogue sample with a smaller lexicon), 21% of doctor turns open
    like an earlier one, patient turns 136 characters with little spread."""
    tally = SpeechTally()
    for r in mdd5k_rows:
        tally.add(r)
    s = tally.summary()
    assert s["patient_turns"] == 2299
    assert s["patient_jargon_share"] == pytest.approx(0.182, abs=0.002)
    assert sum(r["jargon_turns"] for r in mdd5k_rows) == 419  # the column the import writes
    assert s["doctor_repeated_opener_share"] == pytest.approx(0.209, abs=0.002)
    assert s["patient_length"]["cv"] == pytest.approx(0.44, abs=0.01)
    assert s["patient_length"]["share_under_20"] < 0.02


def test_repeated_openers_and_lengths_known_answers():
    turns = [{"speaker": "doctor", "text": t} for t in ("听起来你很累。", "“听起来你睡不好", "你好", "你提到", "你提到过")]
    assert opener("“听起来你睡不好") == "听起来"
    assert repeated_openers(turns) == (2, 5)  # 听起来 twice, 你提到 twice
    assert length_stats([10, 10, 10]) == {"turns": 3, "mean": 10.0, "cv": 0.0, "share_under_20": 1.0}
    assert length_stats([1, 199])["cv"] == pytest.approx(0.99)
