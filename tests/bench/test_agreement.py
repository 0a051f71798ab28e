"""`bench rollout`'s sampler/learner agreement carries its own scale: the learner in float32."""

import mlx.core as mx
from mlx.utils import tree_flatten

from artmlx.bench.rollout import RolloutBench


def test_agreement_measures_rounding_against_float32_and_restores_the_model():
    bench = RolloutBench("tiny", prompt=16, reply=8)
    bench.model.set_dtype(mx.bfloat16)  # as on a GPU (the CPU loads float32)
    before = {name: (value.dtype, value) for name, value in tree_flatten(bench.model.parameters())}
    groups, _ = bench.engine([1, 2], 4)
    agreement = bench.agreement(groups)
    assert agreement["policy_tokens"] == sum(g.policy_tokens for g in groups)
    # bfloat16 rounding moves the logprobs, and by more than the sampler and the learner differ on this CPU
    assert 0 < agreement["max_abs_logprob_diff_vs_float32"]
    assert agreement["max_abs_logprob_diff"] <= agreement["max_abs_logprob_diff_vs_float32"]
    after = dict(tree_flatten(bench.model.parameters()))
    assert after.keys() == before.keys()
    for name, (dtype, value) in before.items():
        assert after[name].dtype == dtype and mx.array_equal(after[name], value), name
