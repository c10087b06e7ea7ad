"""The Gated DeltaNet core over a host's state cache (atom_core.layers.gated_delta_core): sequences
served in pieces across batches (a prefill chunk, an extend chunk, decode steps, mixed with other
sequences in the same batch) give what the standalone core gives for each sequence whole."""

import torch

from atom_core.layers.attention import standalone_batch
from atom_core.layers.gated_delta_core import (
    CachedStateBatch,
    GatedDeltaCoreSpec,
    StandaloneGatedDeltaCore,
    forward_with_state_cache,
)
from atom_core.layers.short_conv import ShortConvolution

HK, HV, K, V, W = 2, 4, 16, 8, 4


def make_spec() -> GatedDeltaCoreSpec:
    conv = ShortConvolution((HK * K, HK * K, HV * V), W)
    with torch.no_grad():
        conv.weight.normal_(0.0, 0.5)
    return GatedDeltaCoreSpec(HK, HV, K, V, conv, "layers.0.core", 0)


def random_inputs(length: int, generator: torch.Generator):
    channels = 2 * HK * K + HV * V
    return (torch.randn(length, channels, generator=generator),
            -torch.rand(length, HV, generator=generator),
            torch.rand(length, HV, generator=generator))


def batch_of(decodes: list[tuple[int, int]], prefills: list[tuple[int, int, int, bool]]):
    """``decodes``: (slot, token); ``prefills``: (slot, start, stop, continues)."""
    cu = [0]
    for _, start, stop, _ in prefills:
        cu.append(cu[-1] + stop - start)
    return CachedStateBatch(
        num_decodes=len(decodes),
        decode_slots=torch.tensor([slot for slot, _ in decodes]),
        num_prefill_tokens=cu[-1],
        prefill_cu_seqlens=torch.tensor(cu, dtype=torch.int32),
        prefill_slots=torch.tensor([p[0] for p in prefills]),
        prefill_has_initial_state=torch.tensor([p[3] for p in prefills]),
    )


def test_pieces_through_the_cache_equal_whole_sequences():
    torch.manual_seed(0)
    spec = make_spec()
    generator = torch.Generator().manual_seed(1)
    lengths = {3: 90, 1: 7}  # slot -> sequence length; slot 3's prefill spans two chunks
    inputs = {slot: random_inputs(n, generator) for slot, n in lengths.items()}
    with standalone_batch([lengths[3]]):
        expected_a = StandaloneGatedDeltaCore(spec)(*inputs[3])
    with standalone_batch([lengths[1]]):
        expected_b = StandaloneGatedDeltaCore(spec)(*inputs[1])

    conv_shape, state_shape = spec.state_shapes()
    # Stale garbage in the slots: a fresh sequence must not read it.
    conv_cache = torch.randn(5, *conv_shape)
    state_cache = torch.randn(5, *state_shape)
    # (decodes, prefills) per step; slot 3's tokens are 0..89, slot 1's 0..6.
    steps = [
        ([], [(3, 0, 70, False)]),
        ([], [(3, 70, 85, True), (1, 0, 5, False)]),
        ([(3, 85), (1, 5)], []),
        ([(3, 86)], [(1, 6, 7, True)]),
        ([(3, 87)], []),
        ([(3, 88)], []),
        ([(3, 89)], []),
    ]
    got = {3: torch.empty_like(expected_a), 1: torch.empty_like(expected_b)}
    for decodes, prefills in steps:
        pieces = [(slot, token, token + 1) for slot, token in decodes]
        pieces += [(slot, start, stop) for slot, start, stop, _ in prefills]
        mixed, g, beta = (torch.cat([inputs[slot][i][start:stop] for slot, start, stop in pieces])
                          for i in range(3))
        padding = 2  # a host may pad the batch; those rows come back zero
        mixed, g, beta = (torch.cat([t, torch.ones_like(t[:1]).expand(padding, *t.shape[1:])])
                          for t in (mixed, g, beta))
        out = forward_with_state_cache(spec, mixed, g, beta, conv_cache, state_cache,
                                       batch_of(decodes, prefills))
        assert out[-padding:].abs().max() == 0
        row = 0
        for slot, start, stop in pieces:
            got[slot][start:stop] = out[row:row + stop - start]
            row += stop - start
    torch.testing.assert_close(got[3], expected_a, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(got[1], expected_b, rtol=1e-4, atol=1e-5)
