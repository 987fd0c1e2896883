import pytest

from aicg import tomlfile

DOC = """\
name = "x"
count = 3
ratio = 2
flag = true
tags = ["a", "b"]

[outer.inner]
used = 1
unused = 2
"""


@pytest.fixture
def doc_path(tmp_path):
    path = tmp_path / "doc.toml"
    path.write_text(DOC)
    return path


def test_values_of_the_right_type_are_returned(doc_path):
    doc = tomlfile.read(doc_path)
    assert doc.get("name", str) == "x"
    assert doc.get("count", int) == 3
    assert doc.get("ratio", float) == 2          # an integer is a number
    assert doc.get("flag", bool) is True
    assert doc.get("tags", list, item=str, choices={"a", "b", "c"}) == ["a", "b"]
    assert doc.get("absent", int, default=7) == 7


def test_a_missing_file(tmp_path, raises_input_error):
    path = tmp_path / "nope.toml"
    with raises_input_error(path, "(file)", "an existing TOML file"):
        tomlfile.read(path)


def test_a_syntax_error_names_the_file_and_line(tmp_path, raises_input_error):
    path = tmp_path / "bad.toml"
    path.write_text('a = 1\nb = = 2\n')
    with raises_input_error(path, "(syntax)", "valid TOML") as info:
        tomlfile.read(path)
    assert "line 2" in str(info.value)


@pytest.mark.parametrize("key, kind, expected", [
    ("name", int, "an integer"),
    ("count", str, "a string"),
    ("flag", int, "an integer"),       # true is not 1
    ("count", bool, "true or false"),  # 1 is not true
    ("flag", float, "a number"),
    ("name", list, "an array"),
    ("missing", str, "a string (the key is missing)"),
])
def test_wrong_or_missing_values(doc_path, raises_input_error, key, kind, expected):
    doc = tomlfile.read(doc_path)
    with raises_input_error(doc_path, key, expected):
        doc.get(key, kind)


def test_choices_and_item_types(doc_path, raises_input_error):
    doc = tomlfile.read(doc_path)
    with raises_input_error(doc_path, "name", "one of 'y', 'z'"):
        doc.get("name", str, choices={"y", "z"})
    with raises_input_error(doc_path, "tags", "one of 'a'") as info:
        doc.get("tags", list, choices={"a"})
    assert "found 'b'" in str(info.value)
    with raises_input_error(doc_path, "tags", "an array of"):
        doc.get("tags", list, item=int)


def test_an_unknown_key_names_its_dotted_path_and_the_known_keys(doc_path, raises_input_error):
    inner = tomlfile.read(doc_path).table("outer").table("inner")
    inner.get("used", int)
    with raises_input_error(doc_path, "outer.inner.unused", "a known key (this table knows: used)"):
        inner.done()


def test_done_accepts_a_fully_read_table(doc_path):
    doc = tomlfile.read(doc_path)
    for key, kind in [("name", str), ("count", int), ("ratio", float), ("flag", bool), ("tags", list)]:
        doc.get(key, kind)
    [(name, inner)] = doc.table("outer").tables()
    assert name == "inner" and inner.prefix == "outer.inner"
    inner.get("used", int), inner.get("unused", int)
    inner.done()
    doc.done()


def test_a_table_that_is_not_a_table(doc_path, raises_input_error):
    with raises_input_error(doc_path, "count", "a table"):
        tomlfile.read(doc_path).table("count")


def test_an_optional_table_that_is_absent_is_empty_and_counts_as_read(tmp_path, raises_input_error):
    path = tmp_path / "t.toml"
    path.write_text("a = 1\n")
    doc = tomlfile.read(path)
    opt = doc.table("opt", default={})
    assert opt.keys() == [] and opt.prefix == "opt"
    with raises_input_error(path, "opt.x", "an integer (the key is missing)"):
        opt.get("x", int)
    doc.get("a", int)
    doc.done()
