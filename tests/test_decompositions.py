"""Every decomposition the atlas claims merges correctly, on random splits and merge orders."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aicg.semantics.decompositions import DECOMPOSITIONS


def test_every_claimed_decomposition_is_executable(shipped_ruleset):
    claimed = {p for op in shipped_ruleset.ops.values() for p in op.properties if p.endswith("_decomposable")}
    assert claimed == set(DECOMPOSITIONS)


@pytest.mark.parametrize("name", sorted(DECOMPOSITIONS))
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_merging_partial_states_equals_the_direct_result(name, data):
    d = DECOMPOSITIONS[name]
    n = data.draw(st.integers(1, 300), label="n")
    seed = data.draw(st.integers(0, 2**32 - 1), label="seed")
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(n) * data.draw(st.sampled_from([1.0, 30.0]), label="scale")
    cuts = sorted(set(data.draw(st.lists(st.integers(1, max(1, n - 1)), max_size=8), label="cuts")) - {n})
    states = [d.state(chunk) for chunk in np.split(x, cuts) if len(chunk)]
    while len(states) > 1:   # merge neighbours in a random order: any tree must give the same result
        i = data.draw(st.integers(0, len(states) - 2), label="merge")
        states[i:i + 2] = [d.merge(states[i], states[i + 1])]
    np.testing.assert_allclose(d.finish(states[0]), d.direct(x), rtol=1e-9, atol=1e-9)
