"""The pathtune command through typer's CliRunner (and once as a real subprocess)."""
import json
import subprocess
import sys

import yaml
from typer.testing import CliRunner

from pathtune.cli import app
from pathtune.specs import default_spec_path, load_spec

runner = CliRunner()


def run(*args):
    return runner.invoke(app, list(args), env={"COLUMNS": "200"})


def test_env_json_parses():
    result = run("env", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert {"env", "env_key", "env_hash", "settings"} <= set(data)
    assert set(data["env_key"]) == {"hard", "soft"}
    assert "gpu_name" in data["env_key"]["hard"] and "driver" in data["env_key"]["soft"]
    assert len(data["env_hash"]) == 64
    assert data["env"]["pathtune"] == "0.1.0"
    assert "PATHTUNE_DB_URL" in data["settings"]


def test_env_table():
    result = run("env")
    assert result.exit_code == 0, result.output
    assert "env_hash" in result.output and "triton" in result.output


def test_spec_show_default():
    result = run("spec", "show")
    assert result.exit_code == 0, result.output
    out = result.output
    for needle in ("householder_chain", "fox_gate", "superchunk_size", "256, 512, 1024, 2048, 4096",
                   "chunk_size * max(D, DV) <= 16384", load_spec().hash, "[B, T, HQ, D]"):
        assert needle in out


def test_spec_show_json_round_trips():
    result = run("spec", "show", "--json")
    assert result.exit_code == 0
    assert json.loads(result.output)["name"] == "path_attention"


def test_spec_validate_good_and_bad(tmp_path):
    result = run("spec", "validate", str(default_spec_path()))
    assert result.exit_code == 0 and "valid" in result.output
    data = yaml.safe_load(default_spec_path().read_text())
    data["stages"]["fox_gate"]["placement"] = "after_scale"
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(data))
    result = run("spec", "validate", str(bad))
    assert result.exit_code == 1
    assert str(bad) in result.output and "stages.fox_gate.placement" in result.output
    assert "Traceback" not in result.output
    missing = run("spec", "validate", str(tmp_path / "nope.yaml"))
    assert missing.exit_code == 1 and "file not found" in missing.output


def test_spec_schema_is_json():
    result = run("spec", "schema")
    assert result.exit_code == 0
    assert "properties" in json.loads(result.output)


def test_demo_runs_reference_on_cpu():
    result = run("demo", "--seq-len", "80", "--batch", "1")
    assert result.exit_code == 0, result.output
    assert "backend: reference" in result.output and "PASS" in result.output
    assert "need an" in result.output  # says plainly what needs a GPU


def test_demo_rejects_bad_dtype():
    result = run("demo", "--dtype", "int8", "--seq-len", "16")
    assert result.exit_code == 1 and "not a floating dtype" in result.output


def test_python_dash_m():
    out = subprocess.run([sys.executable, "-m", "pathtune", "spec", "validate", str(default_spec_path())],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "valid" in out.stdout


def test_tables_piped_to_a_log_keep_their_numbers():
    """`pathtune bench` / `tune` print wide tables; piped into a file or a log (no terminal) they get a
    console wide enough that no cell is elided (an 80-column pipe showed every bench number as '…')."""
    import io

    from rich.console import Console
    from rich.table import Table

    from pathtune.cli._output import table_console

    table = Table()
    for i in range(16):
        table.add_column(f"column {i}")
    table.add_row(*[f"{1.2345 * i:.4f}" for i in range(16)])
    buf = io.StringIO()
    table_console(Console(file=buf, width=80), 240).print(table)
    assert "…" not in buf.getvalue() and "18.5175" in buf.getvalue()
    terminal = Console(file=io.StringIO(), force_terminal=True, width=80)
    assert table_console(terminal, 240) is terminal
