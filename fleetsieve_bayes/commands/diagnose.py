"""``fleetsieve-bayes diagnose DIR [--json]``: r_hat, ESS and divergences of DIR/posterior.nc."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("diagnose", help="MCMC diagnostics of a campaign's stored posterior")
    p.add_argument("dir", help="campaign output directory (reads DIR/posterior.nc) or a .nc file")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from fleetsieve_bayes.model.diagnostics import diagnose_file

    path = Path(args.dir)
    if path.is_dir() or path.suffix != ".nc":
        path = path / "posterior.nc"
    out = diagnose_file(path)
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    fmt = lambda x, p: "n/a" if x is None else f"{x:.{p}f}"  # noqa: E731
    print(f"{path}: {out['method'] or 'posterior'}, {out['chains']} chains x {out['draws']} draws")
    print(
        f"r_hat max {fmt(out['r_hat_max'], 3)}   ESS bulk min {fmt(out['ess_bulk_min'], 0)}   "
        f"ESS tail min {fmt(out['ess_tail_min'], 0)}   divergences {out['divergences']}"
    )
    print(
        f"what decisions read (every cell's latent metrics but cells measured as failures, noise): "
        f"r_hat max {fmt(out['decision_r_hat_max'], 3)}   ESS bulk min {fmt(out['decision_ess_bulk_min'], 0)}"
    )
    if out["failed_under_load"]:
        cells = ", ".join(str(c) for c in out["failed_under_load"])
        print(f"failed runs read as overload (log sigmoid(8 log rho) each): cells {cells}")
    print(f"{'parameter':<28} {'r_hat':>7} {'ess_bulk':>9} {'ess_tail':>9}")
    for r in out["parameters"]:
        print(f"{r['name']:<28} {fmt(r['r_hat'], 3):>7} {fmt(r['ess_bulk'], 0):>9} {fmt(r['ess_tail'], 0):>9}")
    return 0
