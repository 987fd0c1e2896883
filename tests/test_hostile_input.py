"""Hostile and careless input: each is one InputError naming the file, the key and what was
expected, and nothing is written. Most cases are checked at the loaders (profile, TOML, hwdb,
store settings); a few end to end, where doit must exit non-zero with that one line."""
from __future__ import annotations

import builtins
import io
import json
import time
from pathlib import Path

import pytest

from aicg import config, hw, planning, profile, tomlfile
from aicg.errors import InputError
from doit_project import doit, make_project, profile_text

H200 = "nvidia-h200"
SHAPES = "shapes = [[32768, 4096], [4096, 32768], [8192, 1000], [65536, 128]]"


@pytest.fixture
def default_profile(rules_dir):
    return rules_dir / "profiles" / "h200.toml"


@pytest.fixture
def load(shipped_ruleset, hwdb_dir):
    """Load a profile against the shipped rule sets and an editable hwdb/."""
    return lambda path: profile.load(path, shipped_ruleset, hwdb_dir)


@pytest.fixture
def unreadable(monkeypatch):
    """Make opening the given paths fail as a file without read permission does (also for root,
    which the permission bits do not stop)."""
    refused: set[str] = set()
    real_open = io.open

    def guarded_open(file, *args, **kwargs):
        if isinstance(file, (str, Path)) and str(Path(file).resolve()) in refused:
            raise PermissionError(13, "Permission denied", str(file))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(io, "open", guarded_open)
    monkeypatch.setattr(builtins, "open", guarded_open)
    return lambda path: refused.add(str(Path(path).resolve()))


# -- TOML files that are not TOML ------------------------------------------------------------

def test_a_non_utf8_byte(default_profile, load, raises_input_error):
    default_profile.write_bytes(default_profile.read_bytes().replace(b"# The H200", b"# The H\xe9200"))
    with raises_input_error(default_profile, "(encoding)", "UTF-8 text") as info:
        load(default_profile)
    assert "0xe9" in str(info.value)


def test_a_profile_path_that_is_a_directory(rules_dir, load, raises_input_error):
    with raises_input_error(rules_dir / "profiles", "(file)", "a TOML file, not a directory"):
        load(rules_dir / "profiles")


@pytest.mark.parametrize("junk", [bytes(range(256)) * 8, b"\x7fELF\x02\x01\x01" + bytes(120)],
                         ids=["bytes", "elf-header"])
def test_binary_junk(default_profile, load, junk):
    default_profile.write_bytes(junk)
    with pytest.raises(InputError) as info:
        load(default_profile)
    assert info.value.file == str(default_profile) and info.value.key in ("(encoding)", "(syntax)")


@pytest.mark.parametrize("nest", ["x = " + "[" * 50_000 + "]" * 50_000, "x = " + "{a = " * 50_000 + "1" + "}" * 50_000],
                         ids=["arrays", "inline-tables"])
def test_deeply_nested_values(default_profile, load, raises_input_error, nest):
    default_profile.write_text(nest + "\n" + default_profile.read_text())
    with raises_input_error(default_profile, "(syntax)", "nested less deeply"):
        load(default_profile)


def test_a_file_too_large_to_be_an_input(tmp_path, raises_input_error):
    path = tmp_path / "big.toml"
    path.write_text("# padding\n" * (tomlfile.MAX_BYTES // 10 + 1))
    with raises_input_error(path, "(file)", f"at most {tomlfile.MAX_BYTES} bytes"):
        tomlfile.read(path)


@pytest.mark.parametrize("value", ["18446744073709551616", "-9223372036854775809", str(2**70)])
def test_an_integer_beyond_64_bits_anywhere(tmp_path, raises_input_error, value):
    path = tmp_path / "doc.toml"
    path.write_text(f"count = {value}\nlist = [1, {value}]\n")
    doc = tomlfile.read(path)
    with raises_input_error(path, "count", "an integer of at most 64 bits"):
        doc.get("count", int)
    with raises_input_error(path, "list", "an array of integers of at most 64 bits"):
        doc.get("list", list, item=int)


@pytest.mark.parametrize("which", ["profile", "ruleset", "hwdb"])
def test_an_unreadable_input(default_profile, rules_dir, hwdb_dir, unreadable, raises_input_error, which):
    path = {"profile": default_profile, "ruleset": rules_dir / "rules.toml", "hwdb": hwdb_dir / f"{H200}.toml"}[which]
    unreadable(path)
    with raises_input_error(path, "(file)", "a readable TOML file") as info:
        planning.load(rules_dir, default_profile, hwdb_dir)
    assert "Permission denied" in str(info.value)


# -- the profile ----------------------------------------------------------------------------

# (old text, new text, dotted key, what is expected)
BAD = [
    ('name = "h200-tolerance"', r'name = "h200\u0000x"', "instance.name", "a plain folder name"),
    ('name = "h200-tolerance"', r'name = "h200\u001b[31m"', "instance.name", "a plain folder name"),
    ('name = "h200-tolerance"', r'name = "a\\b"', "instance.name", "a plain folder name"),
    ('name = "h200-tolerance"', 'name = ".."', "instance.name", "a plain folder name"),
    ('name = "h200-tolerance"', f'name = "{"n" * 101}"', "instance.name", "a plain folder name"),
    ('target = "nvidia-h200"', 'target = "../outside"', "instance.target", "a hwdb entry"),
    ('target = "nvidia-h200"', 'target = "/tmp/outside"', "instance.target", "a hwdb entry"),
    ('target = "nvidia-h200"', r'target = "nvidia-h200\u0000"', "instance.target", "a hwdb entry"),
    ('ops = ["softmax", "log_softmax", "row_sum", "row_max", "rmsnorm", "layernorm"]', "ops = []",
     "workload[0].ops", "at least one operator"),
    ('dtypes = ["float32", "bfloat16", "float16"]', "dtypes = []", "workload[0].dtypes", "at least one dtype"),
    ("[65536, 128]", "[18446744073709551617, 4]", "workload[0].shapes", "[rows, cols] pairs of positive integers"),
    ("[65536, 128]", f"[{2**31}, 4]", "workload[0].shapes", f"of at most {2**31 - 1}"),
    ("[65536, 128]", f"[{2**62}, {2**62}]", "workload[0].shapes", f"of at most {2**31 - 1}"),
    # int32 rows and columns, but 2^31 x 2^31 float32 elements are 16 EiB: the H200 has 141 GiB
    ("[65536, 128]", f"[{2**31 - 1}, {2**31 - 1}]", "workload[0].shapes", "tensors that fit the memory of nvidia-h200"),
    ("[plan]", "[validation]\ntrials = 0\n\n[plan]", "validation.trials", "an integer >= 1"),
    ("[plan]", "[validation]\ntrials = -3\n\n[plan]", "validation.trials", "an integer >= 1"),
    ("[plan]", "[validation]\ntiming_repetitions = 0\n\n[plan]", "validation.timing_repetitions", "an integer >= 1"),
    ("[plan]", "[preservation]\ntolerance.float32 = { rtol = nan, atol = 0.0 }\n\n[plan]",
     "preservation.tolerance.float32.rtol", "a finite number >= 0"),
    ("[plan]", "[preservation]\ntolerance.float32 = { rtol = 1e-5, atol = -inf }\n\n[plan]",
     "preservation.tolerance.float32.atol", "a finite number >= 0"),
    ("[plan]", "[preservation]\ntolerance.float32 = { rtol = inf, atol = 0.0 }\n\n[plan]",
     "preservation.tolerance.float32.rtol", "a finite number >= 0"),
    ("[plan]", '[cache]\nremote = "ftp://cache.example/aicg"\n\n[plan]', "cache.remote", "an http:// or https:// URL"),
    ("[plan]", "[cache]\ntimeout = nan\n\n[plan]", "cache.timeout", "a positive finite number of seconds"),
    ("[plan]", "[cache]\ntimeout = -1\n\n[plan]", "cache.timeout", "a positive finite number of seconds"),
    ("[plan]", r'[cache]' + '\ncache = "a\\u0000b"\n\n[plan]', "cache.cache", "a directory path"),
]


@pytest.mark.parametrize("old, new, key, expected", BAD, ids=[f"{b[2]}:{b[1][-24:]}" for b in BAD])
def test_bad_profiles(default_profile, edit, load, raises_input_error, old, new, key, expected):
    edit(default_profile, old, new)
    with raises_input_error(default_profile, key, expected):
        load(default_profile)


@pytest.mark.parametrize("old, new, key, expected", [
    ("temperature = 0.0", "temperature = nan", "synthesis.llm.temperature", "a finite number >= 0"),
    ("max_tokens = 4096", "max_tokens = 0", "synthesis.llm.max_tokens", "an integer >= 1"),
    ("timeout = 120.0", "timeout = inf", "synthesis.llm.timeout", "a positive finite number of seconds"),
    ("timeout = 120.0", "timeout = -1", "synthesis.llm.timeout", "a positive finite number of seconds"),
    ('base_url = "http://127.0.0.1:8000/v1"', 'base_url = "ftp://127.0.0.1/v1"', "synthesis.llm.base_url",
     "an http:// or https:// URL"),
])
def test_bad_model_server_settings(rules_dir, edit, load, raises_input_error, old, new, key, expected):
    path = edit(rules_dir / "profiles" / "synthesis.toml", old, new)
    with raises_input_error(path, key, expected):
        load(path)


def test_a_target_outside_hwdb_is_refused_though_the_file_exists(default_profile, edit, load, hwdb_dir,
                                                                  raises_input_error):
    (hwdb_dir.parent / "outside.toml").write_bytes((hwdb_dir / f"{H200}.toml").read_bytes())
    edit(default_profile, 'target = "nvidia-h200"', 'target = "../outside"')
    with raises_input_error(default_profile, "instance.target", "a hwdb entry"):
        load(default_profile)
    with raises_input_error(hwdb_dir / "../outside.toml", "target", "a hwdb entry"):
        hw.load_target(hwdb_dir, "../outside")


def test_the_shapes_of_a_fused_operator_count_all_its_tensors(default_profile, edit, load, raises_input_error):
    """layernorm_residual reads x and a residual and writes a matrix: three tensors of the shape."""
    h200_bytes = hw.load_target(default_profile.parents[2] / "hwdb", H200).fact("dram_capacity")
    cols = 2**16
    rows = int(h200_bytes / (cols * 2) / 2.5)    # 2.5 bfloat16 tensors of it fit, 3 do not
    edit(default_profile, SHAPES, f"shapes = [[{rows}, {cols}]]")
    edit(default_profile, '"float32", "bfloat16", "float16"', '"bfloat16"')
    load(default_profile)     # x and y of a plain row operator fit
    edit(default_profile, '"rmsnorm", "layernorm"]', '"rmsnorm", "layernorm", "residual_rmsnorm"]')
    with raises_input_error(default_profile, "workload[0].shapes", "tensors that fit the memory of nvidia-h200"):
        load(default_profile)


def _many_shapes(n: int) -> str:
    return "shapes = [" + ", ".join(f"[{1 + i // 1000}, {1 + i % 1000}]" for i in range(n)) + "]"


def test_a_workload_at_the_limit_of_shapes_loads_and_one_more_is_refused(default_profile, edit, load,
                                                                         raises_input_error):
    limit = profile.MAX_SHAPES_PER_OPERATOR
    edit(default_profile, SHAPES, _many_shapes(limit))
    assert len(load(default_profile).workload["softmax"].shapes) == limit
    # a second entry adds one distinct shape (and repeats every other): the merged count is over
    default_profile.write_text(default_profile.read_text() + '\n[[workload]]\nops = ["softmax"]\n'
                               f'dtypes = ["float32"]\n{_many_shapes(limit + 1)}\n')
    with raises_input_error(default_profile, "workload", f"at most {limit} distinct shapes per operator"):
        load(default_profile)


def test_ten_thousand_shapes_are_refused_at_once(default_profile, edit, load, raises_input_error):
    edit(default_profile, SHAPES, _many_shapes(10_000))
    start = time.perf_counter()
    with raises_input_error(default_profile, "workload", "distinct shapes per operator"):
        load(default_profile)
    assert time.perf_counter() - start < 2.0


# -- hardware entries -----------------------------------------------------------------------

@pytest.mark.parametrize("section, fact, value", [
    ("facts", "sm_count", "0"), ("measured", "sm_count", "0"), ("facts", "sm_count", "-132"),
    ("measured", "sm_count", "131.5"), ("facts", "dram_bandwidth", "nan"), ("facts", "dram_bandwidth", "inf"),
    ("facts", "dram_bandwidth", "-4.8e12"), ("measured", "dram_copy_bandwidth", "0.0"),
    ("measured", "l2_latency_cycles", "-inf"), ("measured", "launch_overhead", "nan"),
])
def test_impossible_hardware_facts(hwdb_dir, raises_input_error, section, fact, value):
    path = hwdb_dir / f"{H200}.toml"
    text = path.read_text()
    header = f"[{section}.{fact}]\nvalue = "
    start = text.index(header) + len(header)
    path.write_text(text[:start] + value + text[text.index("\n", start):])
    with raises_input_error(path, f"{section}.{fact}.value", "a positive"):
        hw.load(path)


@pytest.mark.parametrize("key, value, expected", [("repetitions", "0", "an integer >= 1"),
                                                   ("spread", "nan", "a finite number >= 0"),
                                                   ("spread", "-0.1", "a finite number >= 0")])
def test_impossible_provenance_of_a_measured_fact(hwdb_dir, raises_input_error, key, value, expected):
    path = hwdb_dir / f"{H200}.toml"
    text = path.read_text()
    start = text.index("[measured.sm_count]")
    at = text.index(f"\n{key} = ", start) + len(f"\n{key} = ")
    path.write_text(text[:at] + value + text[text.index("\n", at):])
    with raises_input_error(path, f"measured.sm_count.{key}", expected):
        hw.load(path)


def test_a_measured_sm_count_of_zero_stops_before_the_plan(rules_dir, hwdb_dir, default_profile, edit,
                                                          raises_input_error):
    edit(hwdb_dir / f"{H200}.toml", "[measured.sm_count]\nvalue = 132", "[measured.sm_count]\nvalue = 0")
    with raises_input_error(hwdb_dir / f"{H200}.toml", "measured.sm_count.value", "a positive whole number"):
        planning.load(rules_dir, default_profile, hwdb_dir)


# -- store settings -------------------------------------------------------------------------

@pytest.fixture
def store_env(monkeypatch):
    for name in ("AICG_CACHE_DIR", "AICG_REMOTE", "AICG_REMOTE_MODE", "AICG_REMOTE_TIMEOUT",
                 "AICG_SIGNING_KEY_FILE", "AICG_RECACHE"):
        monkeypatch.delenv(name, raising=False)
    return lambda **values: [monkeypatch.setenv(k, v) for k, v in values.items()]


def test_a_cache_dir_that_is_a_file(tmp_path, store_env, raises_input_error):
    (tmp_path / "afile").write_text("x")
    for where in (tmp_path / "afile", tmp_path / "afile" / "below"):
        store_env(AICG_CACHE_DIR=str(where))
        with raises_input_error("environment", "AICG_CACHE_DIR", "a directory"):
            config.load(tmp_path)


@pytest.mark.parametrize("remote", ["ftp://cache.example/aicg", "file:///srv/aicg", "http://", "https:///x",
                                    "relative/dir", "cache.example:8080/aicg"])
def test_a_remote_that_is_neither_a_url_nor_an_explicit_directory(tmp_path, store_env, raises_input_error, remote):
    store_env(AICG_REMOTE=remote)
    with raises_input_error("environment", "AICG_REMOTE", "an http:// or https:// URL"):
        config.load(tmp_path)


@pytest.mark.parametrize("remote, expected", [
    ("http://cache.example:8080/aicg", "http://cache.example:8080/aicg"), ("https://cache.example", "https://cache.example"),
    ("/mnt/team/aicg-store", "/mnt/team/aicg-store"), ("./shared", "{root}/shared"), ("../shared", "{root}/../shared")])
def test_remotes_that_are_accepted(tmp_path, store_env, remote, expected):
    store_env(AICG_REMOTE=remote)
    assert config.load(tmp_path).remote == expected.format(root=tmp_path)


@pytest.mark.parametrize("timeout", ["nan", "inf", "0", "-5"])
def test_an_impossible_remote_timeout(tmp_path, store_env, raises_input_error, timeout):
    store_env(AICG_REMOTE_TIMEOUT=timeout)
    with raises_input_error("environment", "AICG_REMOTE_TIMEOUT", "a positive finite number of seconds"):
        config.load(tmp_path)


@pytest.mark.parametrize("text, key, expected", [
    (b"[tool]\naicg = 3\n", "tool.aicg", "a table"),
    (b'tool = "aicg"\n', "tool", "a table"),
    (b"[tool.aicg]\ncache = 5\n", "tool.aicg.cache", "a string"),
    (b"[tool.aicg]\ncahce = 'x'\n", "tool.aicg.cahce", "a known key"),
    (b"[tool.aicg]\nremote = 'ftp://x/y'\n", "tool.aicg.remote", "an http:// or https:// URL"),
    (b"[tool.aicg\n", "(syntax)", "valid TOML"),
    (b"[tool.aicg]\n# caf\xe9\n", "(encoding)", "UTF-8 text"),
])
def test_a_broken_tool_aicg_table(tmp_path, store_env, raises_input_error, text, key, expected):
    (tmp_path / "pyproject.toml").write_bytes(text)
    with raises_input_error(tmp_path / "pyproject.toml", key, expected):
        config.load(tmp_path)


def test_an_unreadable_pyproject(tmp_path, store_env, unreadable, raises_input_error):
    (tmp_path / "pyproject.toml").write_text("[tool.aicg]\n")
    unreadable(tmp_path / "pyproject.toml")
    with raises_input_error(tmp_path / "pyproject.toml", "(file)", "a readable TOML file"):
        config.load(tmp_path)


def test_no_pyproject_is_no_settings(tmp_path, store_env):
    assert config.load(tmp_path).local == tmp_path / "cache" and config.load(tmp_path).remote is None


# -- end to end: doit exits non-zero with the one line, no traceback, nothing built --------

def _refused(tmp_path, profile: str | bytes, *args, env=None, edit_project=None) -> str:
    project = make_project(tmp_path / "p")
    path = project / "rulesets/profiles/small.toml"
    path.write_bytes(profile if isinstance(profile, bytes) else profile.encode())
    if edit_project:
        edit_project(project)
    run = doit(project, *args, "profile=rulesets/profiles/small.toml", env=env)
    assert run.code != 0
    assert "Traceback" not in run.output and len(run.output.strip().splitlines()) == 1, run.output
    assert not (project / "build").exists() and not (project / "cache").exists()
    return run.output


def test_doit_refuses_a_non_utf8_profile(tmp_path):
    output = _refused(tmp_path, profile_text().encode().replace(b"small", b"sm\xffall"), "build")
    assert "small.toml: (encoding): expected UTF-8 text" in output


def test_doit_refuses_a_nul_in_the_instance_name(tmp_path):
    output = _refused(tmp_path, profile_text().replace('name = "small"', r'name = "sm\u0000all"'), "build")
    assert "small.toml: instance.name: expected a plain folder name" in output


def test_doit_refuses_a_measured_sm_count_of_zero(tmp_path):
    def zero_sms(project):
        path = project / "hwdb" / f"{H200}.toml"
        path.write_text(path.read_text().replace("[measured.sm_count]\nvalue = 132", "[measured.sm_count]\nvalue = 0"))
    output = _refused(tmp_path, profile_text(), "list", edit_project=zero_sms)
    assert "nvidia-h200.toml: measured.sm_count.value: expected a positive whole number" in output


def test_doit_refuses_a_cache_dir_that_is_a_file(tmp_path):
    (tmp_path / "afile").write_text("x")
    output = _refused(tmp_path, profile_text(), "build", env={"AICG_CACHE_DIR": str(tmp_path / "afile")})
    assert "environment: AICG_CACHE_DIR: expected a directory" in output


def test_doit_refuses_a_broken_pyproject(tmp_path):
    def broken(project):
        (project / "pyproject.toml").write_text("[tool]\naicg = 3\n")
    output = _refused(tmp_path, profile_text(), "list", edit_project=broken)
    assert "pyproject.toml: tool.aicg: expected a table" in output


def test_doit_list_of_ten_thousand_shapes_answers_in_seconds(tmp_path):
    shapes = tuple((1 + i // 1000, 1 + i % 1000) for i in range(10_000))
    start = time.perf_counter()
    output = _refused(tmp_path, profile_text(shapes=shapes), "list")
    assert time.perf_counter() - start < 10
    assert f"at most {profile.MAX_SHAPES_PER_OPERATOR} distinct shapes per operator" in output


# -- inputs read outside the loaders above (changes asked of their owners) ----------------

def test_an_unreadable_realisation_profile(rules_dir, hwdb_dir, default_profile, unreadable, raises_input_error):
    path = hwdb_dir / f"{H200}.realisation.json"
    unreadable(path)
    with raises_input_error(path, "(file)", "a readable"):
        planning.load(rules_dir, default_profile, hwdb_dir)


@pytest.mark.parametrize("content, key, expected", [
    (b'{"schema": 1, "provenance": {"device": "H\xe9200"}}', "(encoding)", "UTF-8 text"),
    (b'[1, 2, 3]', "(document)", "a JSON object"),
    (b'{"schema": 1, "provenance": [1]}', "provenance", "a table"),
], ids=["latin-1", "a-list", "provenance-a-list"])
def test_a_realisation_profile_that_is_not_one(rules_dir, hwdb_dir, default_profile, raises_input_error,
                                               content, key, expected):
    path = hwdb_dir / f"{H200}.realisation.json"
    path.write_bytes(content)
    with raises_input_error(path, key, expected):
        planning.load(rules_dir, default_profile, hwdb_dir)


def test_a_realisation_measurement_that_is_not_one(rules_dir, hwdb_dir, default_profile, raises_input_error):
    path = hwdb_dir / f"{H200}.realisation.json"
    provenance = {k: "x" for k in ("date", "driver", "clocks", "method", "repetitions", "device", "arch")}
    path.write_text(json.dumps({"schema": 1, "provenance": provenance, "records": ["fast"]}))
    with raises_input_error(path, "records[0]", "a measurement"):
        planning.load(rules_dir, default_profile, hwdb_dir)


def test_an_unreadable_kernel_header(tmp_path, unreadable):
    output = _refused(tmp_path, profile_text(), "list",
                      edit_project=lambda project: unreadable(project / "kernels" / "reduce.cuh"))
    assert "reduce.cuh" in output
