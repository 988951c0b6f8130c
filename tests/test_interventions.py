"""Head ablation by hooks (zero, mean, uniform) and the head mask, on tiny random models of every family.

Expected values are built independently: the W_O input caught by a hook of the test's own, the
value vectors of the from-scratch attention (grouped KV heads already repeated per query head),
and visibility written out by hand (causal, sliding window, padding).
"""

import hashlib
from contextlib import contextmanager

import pytest
import torch
from conftest import in_turn

from headscope.probe.families import family_for
from headscope.probe.encoding import encode_many, pad_batch
from headscope.probe.forward import attention_layers, base_model
from headscope.probe.hooks import LayerModules, catch, watch
from headscope.probe.interventions import ablate, head_dim, head_mask, head_means
from headscope.probe.scratch import attention_from_scratch
from headscope.probe.tiny import TINY_CORPUS
from headscope.probe.verify import capture

TEXTS = ["The cat sat on the mat, and the dog sat on the log!", "Mary told John."]  # two lengths: padding


def _weights_hash(model) -> str:
    h = hashlib.sha256()
    for name, t in model.state_dict().items():
        h.update(name.encode())
        h.update(t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _hooks(model) -> list:
    return [(name, list(m._forward_pre_hooks), list(m._forward_hooks)) for name, m in model.named_modules()]


def _batch(lm, texts=TEXTS):
    return pad_batch(encode_many(lm, texts), lm.device)


def _run(lm, ids, mask):
    with torch.no_grad():
        out = base_model(lm)(input_ids=ids, attention_mask=mask, use_cache=False)
    return out.last_hidden_state


@contextmanager
def _catch(lm, layer):
    """Within the block, W_O's input and the attention input of `layer` caught (copies), by call order where layers
    share one module (ALBERT: this layer's call, not the last repeat's); entered last, they see what the ablation
    hook hands on."""
    family, base = family_for(lm.config), base_model(lm)
    with catch(LayerModules(family, base, lm.config, [layer], "out_proj"), what="input", take=torch.clone) as y, \
            catch(LayerModules(family, base, lm.config, [layer], "attention"), what="input", take=torch.clone) as x:
        yield y, x


def _ablated_slice(lm, layer, heads, method, means=None):
    ids, mask = _batch(lm)
    with ablate(lm, [(layer, h) for h in heads], method=method, means=means), _catch(lm, layer) as (y, _):
        _run(lm, ids, mask)
    with _catch(lm, layer) as (y_clean, x_clean):
        _run(lm, ids, mask)
    return y[layer], y_clean[layer], x_clean[layer], mask


# Every family once, the methods in turn (each still meets every kind of family): ablate registers every
# method's hooks (uniform's input catchers too) on one ExitStack, and the tests below check each method's
# effect on every family.
@pytest.mark.parametrize("tiny, method", in_turn("zero", "mean", "uniform"), indirect=["tiny"])
def test_model_is_bit_for_bit_unchanged_also_after_an_error(tiny, method):
    ids, mask = _batch(tiny)
    means = head_means(tiny, TEXTS) if method == "mean" else None
    before_w, before_out, before_hooks = _weights_hash(tiny.model), _run(tiny, ids, mask), _hooks(tiny.model)
    l0, l1 = attention_layers(tiny)[:2]  # layers 0 and 1, or a hybrid stack's first two attention layers
    with ablate(tiny, [(l0, 1), (l1, 2)], method=method, means=means):
        during = _run(tiny, ids, mask)
    after_ok = _run(tiny, ids, mask)
    with pytest.raises(RuntimeError, match="inside"):
        with ablate(tiny, [(l0, 1), (l1, 2)], method=method, means=means):
            raise RuntimeError("an error inside the block")
    assert _weights_hash(tiny.model) == before_w
    assert torch.equal(after_ok, before_out) and torch.equal(_run(tiny, ids, mask), before_out)
    assert not torch.equal(during, before_out)  # the ablation did something
    assert _hooks(tiny.model) == before_hooks  # every hook of ours removed (the model is shared by other tests)


def test_zero_sets_exactly_the_heads_slices(tiny):
    hs = head_dim(tiny)
    y, clean, _, _ = _ablated_slice(tiny, 1, [0, 2], "zero")
    for h in range(tiny.config.num_attention_heads):
        part, ref = y[..., h * hs : (h + 1) * hs], clean[..., h * hs : (h + 1) * hs]
        if h in (0, 2):
            assert (part == 0).all() and not (ref == 0).all()
        else:
            torch.testing.assert_close(part, ref)  # other heads of the layer untouched


def test_head_means_are_the_mean_over_real_tokens(tiny):
    """Reference: every text alone (no padding at all), W_O input caught by the test's hook."""
    family, base = family_for(tiny.config), base_model(tiny)
    texts = list(TINY_CORPUS[:5])
    rows = {l: [] for l in attention_layers(tiny)}  # a hybrid stack's other layers have no heads
    with watch(LayerModules(family, base, tiny.config, list(rows), "out_proj"),
               lambda l, y: rows[l].append(y[0].clone()), what="input"):
        for t in texts:
            ids, mask = pad_batch(encode_many(tiny, [t]), tiny.device)
            _run(tiny, ids, mask)
    got = head_means(tiny, texts, batch_size=3)  # batches with padding
    nh, hs = tiny.config.num_attention_heads, head_dim(tiny)
    for l, caught in rows.items():
        ref = torch.cat(caught).double().mean(0).view(nh, hs)
        torch.testing.assert_close(got[l].double(), ref, rtol=1e-5, atol=1e-6)


def test_mean_puts_the_heads_mean_at_every_position(tiny):
    hs = head_dim(tiny)
    means = head_means(tiny, list(TINY_CORPUS))
    y, clean, _, _ = _ablated_slice(tiny, 1, [3], "mean", means)
    head3 = slice(3 * hs, 4 * hs)
    assert torch.equal(y[..., head3], means[1, 3].expand_as(y[..., head3]))
    torch.testing.assert_close(y[..., : 3 * hs], clean[..., : 3 * hs])  # the other heads are untouched
    torch.testing.assert_close(y[..., 4 * hs :], clean[..., 4 * hs :])


def test_uniform_is_the_mean_of_the_visible_value_vectors(tiny):
    """Query i gets the mean of v_h(j) over the keys it sees; with GQA v_h is its KV head's (scratch repeats them)."""
    layer = tiny.config.num_hidden_layers - 1
    heads = [0, 1, 3]  # with 2 KV heads: query heads 0, 1 share KV head 0; head 3 reads KV head 1
    y, clean, x, mask = _ablated_slice(tiny, layer, heads, "uniform")
    spec = family_for(tiny.config).layer_spec(base_model(tiny), layer, tiny.config)
    kv = spec.kv_input(capture(tiny, encode_many(tiny, TEXTS), family_for(tiny.config)).inputs)  # shared KV
    res = attention_from_scratch(x, spec, mask, kv=kv)
    values = res.values  # (B, nh, T, vs), per query head
    gate = res.gate if res.gate is not None else torch.ones_like(res.heads_out)  # gated attention keeps its gate
    hs, window = spec.value_head_dim, spec.sliding_window  # a head's slice of W_O's input is as wide as its value
    lengths = mask.sum(1).tolist()
    for b, n in enumerate(lengths):
        for i in range(n):  # padded query rows are not compared
            seen = [j for j in range(n) if (j <= i or not spec.causal) and (window is None or i - j < window)
                    and (spec.local_window is None or abs(i - j) <= spec.local_window)  # ModernBERT's local band
                    and (spec.chunk_size is None or i // spec.chunk_size == j // spec.chunk_size)]  # Llama 4's chunks
            for h in range(spec.n_heads):
                got = y[b, i, h * hs : (h + 1) * hs]
                if h in heads:
                    torch.testing.assert_close(got, values[b, h, seen].mean(0) * gate[b, h, i], rtol=1e-5, atol=1e-5)
                else:
                    torch.testing.assert_close(got, clean[b, i, h * hs : (h + 1) * hs])


def test_uniform_in_a_sliding_layer_sees_only_the_window():
    """Gemma 3's first layer slides over 4 keys: query 7 averages keys 4..7, not 0..7."""
    from headscope.probe.tiny import tiny_model

    lm = tiny_model("gemma3")
    y, _, x, mask = _ablated_slice(lm, 0, [2], "uniform")
    spec = family_for(lm.config).layer_spec(base_model(lm), 0, lm.config)
    v = attention_from_scratch(x, spec, mask).values[0, 2]  # (T, hs)
    hs = spec.head_dim
    torch.testing.assert_close(y[0, 7, 2 * hs : 3 * hs], v[4:8].mean(0), rtol=1e-5, atol=1e-5)
    assert not torch.allclose(y[0, 7, 2 * hs : 3 * hs], v[:8].mean(0), atol=1e-4)


def test_head_mask_of_ones_changes_nothing_and_zero_equals_zero_ablation(tiny):
    ids, mask = _batch(tiny)
    L, H = tiny.config.num_hidden_layers, tiny.config.num_attention_heads
    clean = _run(tiny, ids, mask)
    with head_mask(tiny, torch.ones(L, H)):
        torch.testing.assert_close(_run(tiny, ids, mask), clean, rtol=0, atol=0)
    l0, l1 = attention_layers(tiny)[:2]  # a hybrid stack's rows of other layers are unused
    xi = torch.ones(ids.shape[0], L, H)
    xi[:, l1, 2] = 0
    xi[1, l0, 0] = 0  # example 1 only
    with head_mask(tiny, xi):
        masked = _run(tiny, ids, mask)
    with ablate(tiny, [(l1, 2)]):
        ref0 = _run(tiny, ids, mask)[0]
    with ablate(tiny, [(l1, 2), (l0, 0)]):
        ref1 = _run(tiny, ids, mask)[1]
    torch.testing.assert_close(masked[0], ref0)
    torch.testing.assert_close(masked[1], ref1)


def test_bad_inputs_say_what_is_wrong(tiny):
    with pytest.raises(ValueError, match="out of range"):
        with ablate(tiny, [(9, 0)]):
            pass
    first = attention_layers(tiny)[0]
    with pytest.raises(ValueError, match="method must be one of zero, mean, uniform"):
        with ablate(tiny, [(first, 0)], method="resample"):
            pass
    with pytest.raises(ValueError, match="needs the heads' mean outputs"):
        with ablate(tiny, [(first, 0)], method="mean"):
            pass
    with pytest.raises(ValueError, match="head mask is"):
        with head_mask(tiny, torch.ones(1, 1)):
            pass
