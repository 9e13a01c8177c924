"""torch tensors through the client: views where possible, bfloat16 as bfloat16, exact."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

import wangate
import wangate.torch as wt
from wangate.loopback import LoopbackSites
from wangate.tensorlike import BFloat16Bits

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def sites(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LoopbackSites]:
    lab = LoopbackSites(2, 1, directory=tmp_path_factory.mktemp("sites"))
    try:
        lab.start(timeout_s=60)  # generous: CI machines may be busy
        yield lab
    finally:
        lab.stop()


def shares(tensor: torch.Tensor, array: np.ndarray) -> bool:
    return int(array.__array_interface__["data"][0]) == tensor.data_ptr()


def test_import_wangate_does_not_import_torch() -> None:
    code = "import sys, wangate, wangate.client; assert 'torch' not in sys.modules, 'torch'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parent.parent)


def test_contiguous_and_requires_grad_tensors_are_views() -> None:
    t = torch.randn(64, 3, requires_grad=True)
    array, bf16 = wt.to_numpy(t)
    assert not bf16 and array.dtype == np.float32 and array.shape == (64, 3)
    assert shares(t, array)
    assert array.tobytes() == t.detach().numpy().tobytes()


def test_non_contiguous_tensor_is_a_strided_view() -> None:
    base = torch.arange(60, dtype=torch.float32).reshape(6, 10)
    t = base.t()[2:7:2]
    array, _ = wt.to_numpy(t)
    assert shares(t, array) and not array.flags.c_contiguous
    assert array.tolist() == t.tolist()


def test_bfloat16_goes_as_its_bits_and_comes_back_without_a_copy() -> None:
    t = torch.randn(5, 7).to(torch.bfloat16)
    bits, bf16 = wt.to_numpy(t)
    assert bf16 and bits.dtype == np.uint16 and shares(t, bits)
    assert bits.tobytes() == t.view(torch.int16).numpy().tobytes()
    back = wt.as_tensor(bits.view(BFloat16Bits))
    assert back.dtype == torch.bfloat16 and torch.equal(back, t)
    assert back.data_ptr() == int(bits.__array_interface__["data"][0])


def test_sparse_and_complex_tensors_are_refused_clearly(sites: LoopbackSites) -> None:
    with pytest.raises(wangate.CodecError, match="dense"):
        wt.to_numpy(torch.eye(3).to_sparse())
    with sites["bj"].client() as gw, pytest.raises(wangate.CodecError, match="complex"):
        gw.send("sh", "c", torch.zeros(3, dtype=torch.complex64))


def test_copy_into_writes_in_place_and_checks_the_size() -> None:
    t = torch.zeros(2, 3, dtype=torch.bfloat16)
    wt.copy_into(t, np.arange(6, dtype=np.float32))
    assert t.flatten().tolist() == [0, 1, 2, 3, 4, 5]
    with pytest.raises(wangate.CodecError, match="7 elements"):
        wt.copy_into(t, np.zeros(7, np.float32))


def test_tensors_cross_the_gateway_exactly(sites: LoopbackSites) -> None:
    g = torch.Generator().manual_seed(7)
    sent = {
        "grad": torch.randn(33, 17, generator=g, requires_grad=True),
        "strided": torch.randn(40, 30, generator=g).t()[::3, 5:],
        "bf16": (torch.randn(1000, generator=g) * 1e3).to(torch.bfloat16),
        "bf16.strided": torch.randn(20, 20, generator=g).to(torch.bfloat16)[:, ::2],
        "int64": torch.randint(-(2**40), 2**40, (9, 2), generator=g),
        "half": torch.randn(128, generator=g).half(),
    }
    with sites["bj"].client() as bj, sites["sh"].client() as sh:
        for i, (tag, tensor) in enumerate(sent.items()):
            # A lossy codec asked for a bfloat16 tensor falls back to exact.
            wt.send(bj, "sh", tag, tensor, step=i, codec="int8" if tag == "bf16" else None)
        for i, (tag, tensor) in enumerate(sent.items()):
            got = wt.recv(sh, tag, source="bj", step=i, timeout=30)
            assert got.dtype == tensor.dtype and got.shape == tensor.shape, tag
            assert torch.equal(got, tensor.detach()), tag
        # A plain recv of bfloat16 is its uint16 bits, marked; sent on, it stays bfloat16.
        bj.send("sh", "again", sent["bf16"], step=0)
        bits = sh.recv("again", source="bj", step=0, timeout=30)
        assert isinstance(bits, BFloat16Bits) and bits.dtype == np.uint16
        sh.send("bj", "back", bits, step=0)
        back = wt.recv(bj, "back", source="sh", step=0, timeout=30)
        assert back.dtype == torch.bfloat16 and torch.equal(back, sent["bf16"])


def on_both(sites: LoopbackSites, work: Callable[[wangate.Client], object]) -> dict[str, object]:
    results: dict[str, object] = {}

    def target(name: str) -> None:
        with sites[name].client() as gw:
            results[name] = work(gw)

    threads = [threading.Thread(target=target, args=(name,)) for name in ("bj", "sh")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return results


def test_allreduce_and_broadcast_of_tensors(sites: LoopbackSites) -> None:
    def values(site: str) -> torch.Tensor:
        g = torch.Generator().manual_seed(ord(site[0]))
        return torch.randn(3, 50, generator=g)

    def work(gw: wangate.Client) -> tuple[torch.Tensor, ...]:
        mine = values(gw.site)
        f32 = wt.allreduce(gw, "t.f32", mine.requires_grad_(), op="sum", step=1)
        bf16 = wt.allreduce(gw, "t.bf16", mine.detach().to(torch.bfloat16)[:, ::2], op="sum")
        into = torch.zeros(4, 6, dtype=torch.bfloat16)
        if gw.site == "bj":
            into = torch.arange(24, dtype=torch.float32).reshape(4, 6).to(torch.bfloat16) / 7
        wt.broadcast(gw, "t.bcast", into, root="bj", step=2)
        fresh = wt.broadcast(gw, "t.fresh", values("bj") if gw.site == "bj" else None, root="bj")
        return f32, bf16, into, fresh

    got = on_both(sites, work)
    bj, sh = got["bj"], got["sh"]
    assert isinstance(bj, tuple) and isinstance(sh, tuple)
    total = values("bj") + values("sh")  # two sites: one addition, the same in any order
    for result in (bj, sh):
        assert result[0].dtype == torch.float32 and torch.equal(result[0], total)
        halves = values("bj").to(torch.bfloat16)[:, ::2].float()
        halves = halves + values("sh").to(torch.bfloat16)[:, ::2].float()
        assert result[1].dtype == torch.bfloat16 and torch.equal(result[1], halves.bfloat16())
        expected = torch.arange(24, dtype=torch.float32).reshape(4, 6).to(torch.bfloat16) / 7
        assert result[2].dtype == torch.bfloat16 and torch.equal(result[2], expected)
        assert torch.equal(result[3], values("bj"))
