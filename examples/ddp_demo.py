"""Train one small model with DDP across sites, through wangate's DDP communication hook.

    python examples/ddp_demo.py                      # 3 loopback sites x 2 ranks, on this machine
    python examples/ddp_demo.py --codec int8 --steps 50
    python examples/ddp_demo.py --socket /run/wangate/wangate.sock --ranks 4   # one real site

Without ``--socket`` the script starts real gateways on loopback (``LoopbackSites``: QUIC,
TLS, Unix sockets) and runs every site's ranks here. With ``--socket`` it runs this site's
ranks only; run it on every site's gateway host. Inside a site the ranks reduce with Gloo;
the site's rank 0 hands the site's mean to the gateway, which averages it across sites.
Each site's rank 0 prints the site's loss per step.
"""

from __future__ import annotations

import argparse
import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from regression_task import batch, make_model
from torch.nn.parallel import DistributedDataParallel

import wangate
import wangate.torch as wt
from wangate.loopback import LoopbackSites


def run_rank(index: int, jobs: list[tuple[str, str, int]], args: argparse.Namespace) -> None:
    site_socket, init, rank = jobs[index]
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=args.ranks)
    gw = wangate.Client(site_socket) if rank == 0 else None
    site = [gw.site if gw else ""]
    dist.broadcast_object_list(site, src=0)  # the site's name, for the data shards
    root = args.root or (min([gw.site, *gw.status()["peers"]]) if gw else "")
    model = make_model()
    wt.sync_parameters(model, gw, root=root)  # every site starts from the root's model
    ddp = DistributedDataParallel(model)
    state = wt.AllreduceHookState(client=gw, codec=args.codec, timeout_s=60.0)
    ddp.register_comm_hook(state, wt.allreduce_hook)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    for step in range(args.steps):
        x, y = batch(site[0], rank, step)
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        site_loss = loss.detach().clone()
        dist.all_reduce(site_loss)
        if rank == 0:
            print(f"{site[0]} step {step:3d} loss {site_loss.item() / args.ranks:.5f}", flush=True)
    state.close()
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--socket", help="this site's gateway socket (default: loopback sites)")
    parser.add_argument("--sites", type=int, default=3, help="loopback sites (no --socket)")
    parser.add_argument("--ranks", type=int, default=2, help="processes per site")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--codec", default=None, help="codec for the buckets, e.g. int8")
    parser.add_argument("--root", default=None, help="site whose initial model all use")
    args = parser.parse_args()
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # the ranks talk over loopback here

    def jobs_for(sockets: list[str]) -> list[tuple[str, str, int]]:
        jobs = []
        for path in sockets:
            init = f"tcp://127.0.0.1:{free_port()}"
            jobs += [(path, init, rank) for rank in range(args.ranks)]
        return jobs

    if args.socket:
        jobs = jobs_for([args.socket])
        mp.spawn(run_rank, args=(jobs, args), nprocs=len(jobs))
        return
    with LoopbackSites(args.sites, 2, verbose=False) as lab:
        print(f"{args.sites} sites on loopback ({lab.directory}), {args.ranks} ranks each")
        jobs = jobs_for([str(site.socket_path) for site in lab.sites])
        mp.spawn(run_rank, args=(jobs, args), nprocs=len(jobs))


if __name__ == "__main__":
    main()
