"""``benchmark.json`` through its typed record (``protocol.design.benchmark_file``): every file written so far
reads back to the same JSON, and a file of a newer format, a corrupt one or one that is not a
benchmark record is one line and exit 2 from every command that reads it, with nothing written over it."""

import json
from pathlib import Path

import pytest
from cli_runner import run_cli

from dmlbench.errors import UserInputError
from dmlbench.protocol.design.benchmark_file import BENCHMARK_FORMAT, read_benchmark, write_benchmark

REPO = Path(__file__).resolve().parent.parent
COMMITTED = sorted(REPO.glob("results/*/benchmark.json"))
# A file written before the typed record existed (no ``format``), for the tests of reading old files.
OLD = next(path for path in COMMITTED if "format" not in json.loads(path.read_text()))
SMOKE = REPO / "configs" / "smoke.yaml"


def test_every_committed_benchmark_file_reads_back_to_its_own_json() -> None:
    """Those written before the record existed (no ``format``, no ``analysis_in_hash``) and those
    written by it: the same keys in the same order with the same values, so a continued benchmark
    keeps its description and config hash; the analysis in force is the stored one."""
    assert COMMITTED
    written_by_the_record = []
    for path in COMMITTED:
        stored = json.loads(path.read_text())
        record = read_benchmark(path.parent)
        assert record.format == BENCHMARK_FORMAT and stored.get("format", BENCHMARK_FORMAT) == BENCHMARK_FORMAT
        assert list(record.stored().items()) == list(stored.items()), path
        assert record.methods == stored["methods"] and record.protocol.trials == stored["protocol"]["trials"]
        assert record.fold_layout is not None and record.fold_layout.test_classes == stored["fold_layout"]["test_classes"]
        assert record.analysis_in_hash == ("format" in stored), path
        assert record.analysis_in_force() == stored["analysis"], path
        if "format" in stored:
            written_by_the_record.append(path.parent.name)
    assert "reality_check_emoji" in written_by_the_record


def test_an_old_file_is_written_back_with_a_format_and_nothing_else_changed(tmp_path: Path) -> None:
    source = OLD
    (tmp_path / "benchmark.json").write_text(source.read_text())
    write_benchmark(tmp_path, read_benchmark(tmp_path))
    written = json.loads((tmp_path / "benchmark.json").read_text())
    assert written == {"format": BENCHMARK_FORMAT, **json.loads(source.read_text())}
    assert list(written) == ["format", *json.loads(source.read_text())]


def _planted(directory: Path, text: str) -> bytes:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "benchmark.json").write_text(text)
    return (directory / "benchmark.json").read_bytes()


def _newer() -> str:
    return json.dumps({**json.loads(OLD.read_text()), "format": BENCHMARK_FORMAT + 1})


def _without_methods() -> str:
    return json.dumps({key: value for key, value in json.loads(OLD.read_text()).items() if key != "methods"})


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (_newer(), f"was written by a newer dmlbench (format {BENCHMARK_FORMAT + 1}; this one reads format {BENCHMARK_FORMAT}"),
        ('{"spec": {"base": ', "is not valid JSON"),
        (_without_methods(), "is not a benchmark record (key 'methods': Field required)"),
        ('["a", "list"]', "is not a benchmark record"),
        (json.dumps({**json.loads(OLD.read_text()), "protocol": {"folds": "four"}}), "key 'protocol.folds'"),
    ],
)
def test_a_newer_corrupt_or_foreign_file_is_one_line_exit_2_and_left_as_it_is(
        text: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    directory = tmp_path / "out"
    before = _planted(directory, text)
    with pytest.raises(UserInputError, match="benchmark.json"):
        read_benchmark(directory)
    for argv in (["report", str(directory)], ["audit", str(directory)], ["status", str(directory)],
                 ["benchmark", str(SMOKE), "-o", str(directory), "-q"]):
        code, _, err = run_cli(argv, capsys)
        assert code == 2 and len(err.strip().splitlines()) == 1 and message in err, (argv, err)
        assert (directory / "benchmark.json").read_bytes() == before, argv
    assert sorted(path.name for path in directory.iterdir()) == ["benchmark.json"]  # nothing else written either


def test_a_benchmark_of_one_reproduction_started_before_the_rule_opens_and_its_report_says_why(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """``protocol.reproductions`` below 2 is refused in a config, but a stored benchmark that an older dmlbench
    ran with one reproduction still reads: its report says why it has no intervals or verdicts, instead of
    calling its ``benchmark.json`` damaged; continuing it with its config is the config's one-line refusal."""
    import dmlbench.protocol.design.benchmark as benchmark_module

    output = tmp_path / "one"
    with monkeypatch.context() as older:  # the dmlbench of before the rule
        older.setattr(benchmark_module, "MIN_REPRODUCTIONS", 1)
        code, _, err = run_cli(["benchmark", str(SMOKE), "protocol.reproductions=1", "-o", str(output), "-q"], capsys)
        assert code == 0, err
    assert read_benchmark(output).protocol.reproductions == 1
    code, _, err = run_cli(["report", str(output), "-o", str(tmp_path / "report")], capsys)
    assert code == 0, err
    summary = (tmp_path / "report" / "report.md").read_text().split("## Summary", 1)[1].split("\n## ", 1)[0]
    assert "One reproduction per method: no 95% intervals, paired tests, verdicts or power" in summary
    assert "interval above" not in summary and "Primary endpoint" not in summary
    stored = (output / "benchmark.json").read_bytes()
    code, _, err = run_cli(["benchmark", str(SMOKE), "protocol.reproductions=1", "-o", str(output), "-q"], capsys)
    assert code == 2 and "1 is too few" in err and len(err.strip().splitlines()) == 1, err
    assert (output / "benchmark.json").read_bytes() == stored
