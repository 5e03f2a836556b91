"""The bench script runs end to end on a small file and writes its JSON and markdown row."""

import json
import runpy
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench" / "bench_load.py"


def test_bench_writes_json_and_a_markdown_row(tmp_path, big_file, monkeypatch, capsys):
    out = tmp_path / "report.json"
    monkeypatch.setattr(sys, "argv", [str(BENCH), str(big_file), "--runs", "2", "--json", str(out)])
    runpy.run_path(str(BENCH), run_name="__main__")
    doc = json.loads(out.read_text())
    assert doc["bytes"] == 24 * 512 * 1024 * 4
    r = doc["results"]
    for key in ("hf", "auto", "owned", "stream"):
        assert len(r[key]["seconds"]) == 2, key
        assert 0 < r[key]["gbps_min"] <= r[key]["gbps_median"] <= r[key]["gbps_max"], key
    assert r["auto"]["report"]["io_mode"] == "mapped", r["auto"]["report"]["reason"]
    assert r["owned"]["report"]["io_mode"] != "mapped"
    assert r["owned"]["report"]["reason"].startswith("owned: residence"), "the default is owned"
    assert doc["markdown_row"] in capsys.readouterr().out
