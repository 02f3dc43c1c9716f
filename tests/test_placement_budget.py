"""Budgets: sizes and ``max_memory`` text, read and written back.

Sizes in kB..GiB are read by accelerate's ``convert_file_size_to_int``; the tests below pin
where ours reads a text the same way and where it deliberately differs.
"""

from __future__ import annotations

import pytest
from accelerate.utils import convert_file_size_to_int
from hypothesis import given, settings
from hypothesis import strategies as st

from inspector import InspectorError
from inspector.placement import device_order, format_max_memory, parse_max_memory, parse_size

GiB, MiB = 2**30, 2**20
# every unit a text may name, in upper case, with its bytes (KB = 10**3, KiB = 2**10)
UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
         "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


@pytest.mark.parametrize("text, expected", [
    ("20GiB", 20 * GiB),
    ("1.5 GB", 1_500_000_000),
    ("300MB", 300_000_000),
    (".5KiB", 512),
    ("7", 7),
])
def test_sizes_read_as_accelerate_reads_them(text, expected):
    assert parse_size(text) == expected
    if text[-1].isalpha():  # accelerate reads no unitless text
        assert convert_file_size_to_int(text.replace(" ", "")) == expected


@pytest.mark.parametrize("text, ours, theirs", [
    # a final lower-case "b" is bits to accelerate; a budget is bytes in any case here
    ("5Gb", 5 * 10**9, 625_000_000),
    ("300mb", 300 * 10**6, 300 * 10**6 // 8),
])
def test_lower_case_units_are_bytes_not_bits(text, ours, theirs):
    assert convert_file_size_to_int(text) == theirs
    assert parse_size(text) == ours


@pytest.mark.parametrize("text, expected", [
    ("4096", 4096),           # bytes without a unit
    ("100B", 100),
    ("2TiB", 2 * 2**40),      # accelerate knows no T units
    ("1.5TB", 1_500_000_000_000),
    (" 5 kib ", 5 * 1024),    # spaces around and inside
])
def test_forms_accelerate_does_not_read(text, expected):
    with pytest.raises(ValueError):
        convert_file_size_to_int(text)
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["1e3GB", "nanGB", "infGiB", "-1GB", "lots", "20 GiBs", "2 x"])
def test_unreadable_sizes_name_the_field_and_say_what_to_write(text):
    with pytest.raises(
        InspectorError,
        match=r"^budget for device 0: cannot read .* as a size; write bytes or a "
        r"number with a unit such as 20GiB",
    ):
        parse_size(text, "budget for device 0")


@pytest.mark.parametrize("value, words", [
    (-5, "-5 is negative; write 0 or more bytes"),
    (float("inf"), "inf is not a finite number of bytes; write bytes"),
    ("1" * 400 + "GiB", "is not a finite number of bytes; write bytes"),  # overflows a float
    (True, "True is not a size"),
])
def test_bad_numbers(value, words):
    with pytest.raises(InspectorError, match=f"^limit: .*{words}"):
        parse_size(value, "limit")


def test_whole_bytes_stay_exact_beyond_float_precision():
    n = 2**60 + 1  # a float would round it to 2**60
    assert parse_size(n) == n and parse_size(str(n)) == n and parse_size(f"{n}B") == n
    assert parse_size(1.9) == 1  # a float is cut to whole bytes


def test_the_field_of_a_budget_entry_is_named():
    with pytest.raises(InspectorError, match=r"budget for device 'cpu': cannot read 'lots'"):
        parse_max_memory("0=1GiB,cpu=lots")


# ----------------------------------------------------------------------------- properties

DEVICES = st.one_of(st.sampled_from(["cpu", "disk", "mps"]), st.integers(0, 15))
BYTES = st.one_of(
    st.integers(0, 2**70),                      # any count, written as plain bytes
    st.integers(0, 2**20).map(lambda k: k * GiB),  # whole GiB, written as kGiB
    st.integers(1, 2**20).map(lambda k: k * MiB),
    st.integers(0, 10**6).map(lambda k: k * 10**9),
)


@settings(max_examples=50, deadline=None)
@given(st.dictionaries(DEVICES, BYTES, min_size=1, max_size=6))
def test_format_then_parse_gives_the_budget_back(budget):
    back = parse_max_memory(format_max_memory(budget))
    assert back == budget
    assert list(back) == sorted(budget, key=device_order)


def _spellings(dev: int | str) -> st.SearchStrategy[str]:
    if isinstance(dev, int):
        return st.sampled_from([str(dev), f"cuda:{dev}", f"CUDA:{dev}"] + (["cuda"] if dev == 0 else []))
    return st.sampled_from([dev, dev.upper()] + (["mps:0"] if dev == "mps" else []))


@st.composite
def budget_texts(draw: st.DrawFn) -> tuple[str, dict[int | str, int]]:
    """A well-formed budget text with random spellings, and the bytes it means (worked out here)."""
    devices = draw(st.lists(DEVICES, min_size=1, max_size=5, unique=True))
    parts, expected = [], {}
    for dev in devices:
        number = draw(st.integers(0, 10**6))  # small enough that a float product stays exact
        unit = draw(st.sampled_from(sorted(UNITS)))
        spelt = "".join(c.lower() if draw(st.booleans()) else c for c in unit)  # any case: "gIb", "Mb"
        name = draw(_spellings(dev))
        # "DEVICE:SIZE" too, except after a bare "cuda", where "cuda:7" names GPU 7
        sep = "=" if name == "cuda" else draw(st.sampled_from(["=", ":"]))
        gap = draw(st.sampled_from(["", " "]))
        parts.append(f"{gap}{name}{sep}{gap}{number}{gap}{spelt}{gap}")
        expected[dev] = number * UNITS[unit]
    return ",".join(parts), expected


@settings(max_examples=50, deadline=None)
@given(budget_texts())
def test_parse_reads_well_formed_texts(case):
    text, expected = case
    assert parse_max_memory(text) == expected
