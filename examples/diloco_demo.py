"""Train one small model with DiLoCo across sites: each site trains alone for H inner steps,
then the sites average their pseudo-gradients through wangate and take an outer step.

    python examples/diloco_demo.py                          # 3 loopback sites, H = 10
    python examples/diloco_demo.py --sync-every 20 --codec int8 --steps 200
    python examples/diloco_demo.py --socket /run/wangate/wangate.sock   # one real site

Without ``--socket`` the script starts real gateways on loopback (``LoopbackSites``) and
runs one trainer process per site here; with ``--socket`` it runs this site's trainer only
(run it at every site). Each site prints its loss per inner step; the WAN carries one
pseudo-gradient per site every H steps instead of one gradient per step.
"""

from __future__ import annotations

import argparse

import torch
import torch.multiprocessing as mp
from regression_task import batch, make_model

import wangate
import wangate.torch as wt
from wangate.loopback import LoopbackSites


def run_site(index: int, sockets: list[str], args: argparse.Namespace) -> None:
    torch.set_num_threads(1)
    with wangate.Client(sockets[index]) as gw:
        model = make_model()
        wt.sync_parameters(model, gw, root=min([gw.site, *gw.status()["peers"]]))
        inner = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
        diloco = wt.DiLoCo(model, inner, gw, sync_every=args.sync_every, codec=args.codec)
        for step in range(args.steps):
            x, y = batch(gw.site, step)
            loss = torch.nn.functional.mse_loss(model(x), y)
            inner.zero_grad()
            loss.backward()
            inner.step()
            synced = diloco.step()
            note = f"  <- outer step {diloco.outer_steps}" if synced else ""
            print(f"{gw.site} step {step:3d} loss {loss.item():.5f}{note}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--socket", help="this site's gateway socket (default: loopback sites)")
    parser.add_argument("--sites", type=int, default=3, help="loopback sites (no --socket)")
    parser.add_argument("--steps", type=int, default=60, help="inner steps")
    parser.add_argument("--sync-every", type=int, default=10, help="H: inner steps per outer")
    parser.add_argument("--codec", default=None, help="codec for pseudo-gradients, e.g. int8")
    args = parser.parse_args()
    if args.socket:
        run_site(0, [args.socket], args)
        return
    with LoopbackSites(args.sites, 2, verbose=False) as lab:
        print(f"{args.sites} sites on loopback ({lab.directory}), H = {args.sync_every}")
        sockets = [str(site.socket_path) for site in lab.sites]
        mp.spawn(run_site, args=(sockets, args), nprocs=len(sockets))


if __name__ == "__main__":
    main()
