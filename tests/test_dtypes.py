import numpy as np
import pytest

from aicg.dtypes import DTYPES

BF16 = DTYPES["bfloat16"]


def bits(f32_bits):
    """float32 values from their bit patterns."""
    return np.array(f32_bits, dtype=np.uint32).view(np.float32)


# float32 bit pattern -> bfloat16 bit pattern, by hand: keep the top 16 bits
# and round the low 16 to nearest, ties (0x8000) to the even top half.
@pytest.mark.parametrize("f32, bf16", [
    (0x3F800000, 0x3F80),   # 1.0 exactly
    (0x3F807FFF, 0x3F80),   # just below half an ulp: down
    (0x3F808000, 0x3F80),   # 1 + 2^-8: tie, 0x3F80 is even: down
    (0x3F808001, 0x3F81),   # just above the tie: up
    (0x3F818000, 0x3F82),   # 1 + 3 * 2^-8: tie, 0x3F81 is odd: up to even
    (0xBF808000, 0xBF80),   # negative tie: down in magnitude
    (0xBF818000, 0xBF82),   # negative tie: up in magnitude to even
    (0x00018000, 0x0002),   # subnormal tie to even
    (0x00008000, 0x0000),   # subnormal tie to even (zero)
    (0x80000000, 0x8000),   # -0 keeps its sign
    (0x7F7F8000, 0x7F80),   # tie at the top of the range: up to even, which is +inf
    (0x7F7F7FFF, 0x7F7F),   # below the tie: the largest finite bfloat16
    (0x7F800000, 0x7F80),   # +inf
    (0xFF800000, 0xFF80),   # -inf
])
def test_bfloat16_rounds_to_nearest_even(f32, bf16):
    out = BF16.encode(bits([f32]))
    assert out.dtype == np.uint16
    assert int(out[0]) == bf16, f"{f32:#010x} -> {int(out[0]):#06x}, expected {bf16:#06x}"


@pytest.mark.parametrize("nan", [0x7FC00000, 0x7F800001, 0xFFC00000, 0x7FFFFFFF, 0xFFFFFFFF])
def test_nan_stays_nan(nan):
    out = BF16.encode(bits([nan]))
    assert np.isnan(BF16.decode(out)[0])


def test_infinities_round_trip():
    x = np.array([np.inf, -np.inf], dtype=np.float32)
    assert np.array_equal(BF16.decode(BF16.encode(x)), x)


def test_decode_of_encode_is_within_half_a_bfloat16_ulp():
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(100_000) * 10.0 ** rng.uniform(-30, 30, 100_000)).astype(np.float32)
    y = BF16.decode(BF16.encode(x))
    assert y.dtype == np.float32
    rel = np.abs(y.astype(np.float64) - x) / np.abs(x.astype(np.float64))
    assert rel.max() <= 2.0 ** -8
    assert np.array_equal(BF16.encode(y), BF16.encode(x))          # bfloat16 values are fixed points


def test_every_bfloat16_value_decodes_and_encodes_back():
    every = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    finite = ~np.isnan(BF16.decode(every))
    assert np.array_equal(BF16.encode(BF16.decode(every))[finite], every[finite])


def test_float32_is_stored_as_is_and_copied():
    f32 = DTYPES["float32"]
    x = np.array([1.5, -np.inf, 3e-40], dtype=np.float32)
    stored = f32.encode(x)
    assert np.array_equal(stored, x) and stored is not x
    stored[0] = 0
    assert x[0] == 1.5
    assert f32.decode(stored).dtype == np.float32


def test_sizes_match_the_storage():
    for d in DTYPES.values():
        assert np.dtype(d.storage).itemsize == d.size


def test_float16_encodes_as_ieee_half_rounded_to_nearest_even():
    from aicg.dtypes import DTYPES
    half = DTYPES["float16"]
    values = np.array([1.0, 1 + 2**-11, 1 + 3 * 2**-11, 65504.0, 65520.0, -0.0, np.inf, 2**-25], np.float32)
    bits = half.encode(values)
    assert bits.dtype == np.uint16
    # 1 + 2^-11 is a tie between 1 and 1 + 2^-10: even wins (1); 1 + 3*2^-11 rounds up to 1 + 2^-9
    assert list(bits[:3]) == [0x3C00, 0x3C00, 0x3C02]
    assert bits[3] == 0x7BFF and bits[4] == 0x7C00          # the largest half, then overflow to inf
    assert bits[5] == 0x8000 and bits[6] == 0x7C00 and bits[7] == 0x0000   # -0, inf, 2^-25 ties to even (0)
    assert np.array_equal(half.decode(bits[:4]), np.array([1.0, 1.0, 1 + 2**-9, 65504.0], np.float32))


def test_encoding_leaves_its_input_alone():
    x = np.array([1.00390625, -3.5, np.nan, 1e38], dtype=np.float32)
    before = x.copy()
    BF16.encode(x)
    assert np.array_equal(x.view(np.uint32), before.view(np.uint32))
