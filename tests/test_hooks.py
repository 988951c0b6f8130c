"""probe/hooks.py: one way to reach a module (by path or by a family's names) and catch or replace its input or
output, every hook removed however the block ends."""

from __future__ import annotations

import threading

import pytest
import torch

from headscope.probe.hooks import catch, module_at, modules_at, replace, watch


def _net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))


def _hook_count(net):
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in net.modules())


def _no_hooks(net):
    return all(not m._forward_hooks and not m._forward_pre_hooks for m in net.modules())


def test_catch_keeps_each_modules_input_and_output_by_path_and_removes_its_hooks():
    net, x = _net(), torch.randn(5, 3)
    where = modules_at(net, {"first": "0", "last": "2"})
    with catch(where, what="input") as ins, catch(where) as outs:
        y = net(x)
    h = net[0](x)  # independently: the first layer's output, and the last layer's input is relu of it
    assert torch.equal(ins["first"], x) and torch.equal(outs["first"], h)
    assert torch.equal(ins["last"], torch.relu(h)) and torch.equal(outs["last"], y)
    assert not outs["last"].requires_grad  # detached by default
    assert _no_hooks(net)


def test_input_by_keyword_is_the_hidden_states_argument():
    class Takes(torch.nn.Module):
        def forward(self, hidden_states, scale=1.0):
            return hidden_states * scale

    m, x = Takes(), torch.randn(2, 3)
    with catch({0: m}, what="input") as ins, catch({0: m}, what="arguments", take=lambda call: call[1]["scale"]) as kw:
        m(hidden_states=x, scale=2.0)
    assert torch.equal(ins[0], x) and kw[0] == 2.0


def test_replace_changes_the_output_or_input_and_none_leaves_it():
    net, x = _net(), torch.randn(5, 3)
    with replace({"relu": net[1]}, lambda key, out: torch.zeros_like(out)):
        assert torch.equal(net(x), net[2].bias.expand(5, 2))  # nothing after the ReLU but the bias
    with replace({"head": net[2]}, lambda key, inp: inp * 0, what="input"):
        assert torch.equal(net(x), net[2].bias.expand(5, 2))
    with replace({"head": net[2]}, lambda key, out: None):
        assert torch.equal(net(x), net[2](torch.relu(net[0](x))))
    assert _no_hooks(net)


class _Takes(torch.nn.Module):
    """`hidden_states * scale + shift`: a module called with keyword arguments, as a model's attention is."""

    def forward(self, hidden_states, scale=1.0, shift=0.0):
        return hidden_states * scale + shift


@pytest.mark.parametrize("kind", ["catch", "replace", "watch", "arguments"])
def test_every_hook_is_removed_when_the_block_raises(kind):
    net = _net()
    where = {i: m for i, m in enumerate(net)}
    block = {"catch": lambda: catch(where, what="input"),
             "replace": lambda: replace(where, lambda k, v: v),
             "watch": lambda: watch(where, lambda k, v: None, what="input"),
             "arguments": lambda: replace(where, lambda k, call: call, what="arguments")}[kind]
    with pytest.raises(ZeroDivisionError):
        with block():
            assert not _no_hooks(net)
            net(torch.randn(1, 3))
            1 / 0
    assert _no_hooks(net)


def test_a_path_with_no_module_says_which():
    with pytest.raises(LookupError, match="Sequential has no module at '7'"):
        module_at(_net(), "7")


def test_replace_changes_a_keyword_argument_or_the_input_passed_by_keyword():
    m, x = _Takes(), torch.randn(2, 3)

    def doubled_scale(key, call):
        args, kwargs = call
        return args, {**kwargs, "scale": kwargs["scale"] * 2}

    with replace({"m": m}, doubled_scale, what="arguments"):
        assert torch.equal(m(x, scale=3.0, shift=1.0), x * 6.0 + 1.0)
        assert torch.equal(m(hidden_states=x, scale=0.5), x * 1.0)
    with replace({"m": m}, lambda key, inp: inp + 1, what="input"):
        assert torch.equal(m(hidden_states=x, shift=2.0), (x + 1) + 2.0)  # by keyword
        assert torch.equal(m(x, 2.0), (x + 1) * 2.0)  # by position, the other arguments kept
    assert torch.equal(m(x, scale=3.0), x * 3.0) and not m._forward_pre_hooks


def test_watch_sees_every_call_and_changes_nothing():
    m, x = _Takes(), torch.randn(2, 3)
    seen = []
    with watch({"m": m}, lambda key, out: seen.append((key, out)) or torch.zeros(1)):  # what it returns: ignored
        first, second = m(x), m(x, scale=2.0)
    assert torch.equal(first, x) and torch.equal(second, 2 * x)
    assert [key for key, _ in seen] == ["m", "m"] and torch.equal(seen[1][1], 2 * x)  # both calls, not the last only
    assert not m._forward_hooks


def test_thread_limits_the_hooks_to_that_threads_calls():
    """A server's pass through the same model, on another thread, is neither caught nor changed."""
    net, x = _net(), torch.randn(4, 3)
    clean = net(x)
    got: dict = {}

    def other():
        got["out"] = net(x)

    with catch({"last": net[2]}, thread=threading.current_thread()) as mine, \
            replace({"relu": net[1]}, lambda key, out: out * 0, thread=threading.current_thread()):
        worker = threading.Thread(target=other)
        worker.start()
        worker.join()
        assert "last" not in mine and torch.equal(got["out"], clean)  # the other thread's call passed through
        zeroed = net(x)
    assert torch.equal(mine["last"], zeroed) and torch.equal(zeroed, net[2].bias.expand(4, 2))
    assert _no_hooks(net)


class _Stop(Exception):
    pass


def test_a_callback_that_raises_stops_the_pass_there_and_leaves_no_hook():
    net, x = _net(), torch.randn(2, 3)
    ran = []

    def stop(key, out):
        raise _Stop

    with watch({i: m for i, m in enumerate(net)}, lambda key, v: ran.append(key), what="input"), \
            watch({"first": net[0]}, stop):
        with pytest.raises(_Stop):
            net(x)
    assert ran == [0] and _no_hooks(net)  # the ReLU and the last layer never ran


def test_catch_layers_tells_apart_layers_that_share_one_module():
    """ALBERT runs one layer module for every layer: each layer's attention input is still its own, the hidden
    state the model reports before that layer (an independent reading: output_hidden_states)."""
    from conftest import _tiny
    from headscope.probe.families import family_for
    from headscope.probe.forward import base_model
    from headscope.probe.hooks import catch_layers

    lm = _tiny("albert")
    family, base = family_for(lm), base_model(lm)
    layers = family.attention_layers(lm.config)
    assert len({id(family.attention(base, i)) for i in layers}) == 1 < len(layers)  # really one shared module
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.inference_mode():  # transformers installs its own output-recording hooks on a first call
        base(input_ids=ids, output_hidden_states=True)
    before = _hook_count(base)
    with torch.inference_mode(), catch_layers(family, base, lm.config, layers, where="attention", what="input") as ins:
        states = base(input_ids=ids, output_hidden_states=True).hidden_states
    assert sorted(ins) == list(layers)
    for i in layers:
        assert torch.equal(ins[i], states[i])
    assert _hook_count(base) == before  # the model's own hooks (transformers registers some) only


def test_no_probe_registers_a_forward_hook_but_through_hooks_py():
    """One mechanism: every scoped hook goes through probe/hooks.py (removed on every exit); heap.py's hook lives as
    long as the model it was loaded with, by design."""
    from pathlib import Path

    import headscope.probe as probe

    root = Path(probe.__file__).resolve().parent
    allowed = {root / "hooks.py", root / "heap.py"}
    found = [f"{path.relative_to(root)}:{n}" for path in sorted(root.rglob("*.py")) if path not in allowed
             for n, line in enumerate(path.read_text().splitlines(), 1)
             if "register_forward_hook" in line or "register_forward_pre_hook" in line]
    assert not found, f"hooks registered outside probe/hooks.py: {found}"
