"""`edgeinferctl model bundle|sign|verify|self-sign|quantize|bench|allow-downgrade` and `edgeinferctl keys
generate`: model bundles and their signing keys."""
from __future__ import annotations

import os
import sys


def cmd_model_bundle(args) -> int:
    from edgeinfer.models.tools.writer import write_bundle
    write_bundle(args)
    return 0


def cmd_model_sign(args) -> int:
    from edgeinfer.models.verify import sign_bundle
    print(sign_bundle(args.bundle, args.key, args.cert, tuple(args.chain)))
    return 0


def _size_limits(args):
    """--max-*: edgeinferd's model.max_* keys, with the same defaults."""
    from edgeinfer.models.bundle import SizeLimits
    d = SizeLimits()
    return SizeLimits(model=args.max_model_mib << 20 if args.max_model_mib else d.model,
                      meta=args.max_meta_kib << 10 if args.max_meta_kib else d.meta,
                      other=args.max_file_mib << 20 if args.max_file_mib else d.other,
                      bundle=args.max_bundle_mib << 20 if args.max_bundle_mib else d.bundle)


def _verify(bundle: str, trust_dir: str, limits, state_dir: str | None) -> str:
    """The daemon's own checks of a bundle (bundlecheck.check_bundle); returns the OK line."""
    from edgeinfer.models.check import check_bundle
    from edgeinfer.models.rollback import RollbackState
    model = check_bundle(bundle, trust_dir, limits, RollbackState(state_dir) if state_dir else None,
                         lambda w: print(f"edgeinferctl: warning: {w}", file=sys.stderr))
    meta = model.meta
    family = f" (family {meta.family})" if meta.family and meta.family != meta.name else ""
    return f"{bundle}: OK: {meta.name} {meta.version}{family}, signed by {model.signer.key_file}"


def cmd_model_verify(args) -> int:
    print(_verify(args.bundle, args.trust_dir, _size_limits(args), args.state_dir))
    return 0


def cmd_model_self_sign(args) -> int:
    from edgeinfer.models.bundle import SizeLimits
    from edgeinfer.models.verify import self_sign
    verified = []
    pub = self_sign(args.bundle, args.out, args.trust_dir, args.key_name,
                    check=lambda out, trust: verified.append(_verify(out, trust, SizeLimits(), None)))
    print(f"copied {args.bundle} to {args.out} and signed the copy ({os.path.join(args.out, 'model.sig')}) with a "
          "new P-256 key made for it; its private key is deleted (it can sign nothing else)")
    print(f"trusted its public key: {pub} (remove it to stop trusting this bundle)")
    print(f"verified as edgeinferd does: {verified[0]}")
    return 0


def cmd_model_quantize(args) -> int:
    from edgeinfer.support.cpuflags import cpu_int8
    from edgeinfer.cameras.framesource import image_frames, stream_frames
    from edgeinfer.models.tools.quantize import Options, quantize_bundle
    cpu = cpu_int8()
    print(cpu.line())
    if not cpu.fast_int8:
        print(f"edgeinferctl: note: {cpu.note}", file=sys.stderr)
    n = args.frames + args.held_out
    if args.calibration:
        frames, note = image_frames(args.calibration, n), f" from {args.calibration}"
    else:
        print(f"waiting for the camera of stream {args.from_stream} on {args.socket} (point its ingress socket "
              "there)", flush=True)
        frames, note = stream_frames(args.from_stream, n, args.socket, args.wait), f" of stream {args.from_stream}"
    meta = quantize_bundle(args.bundle, frames, args.frames, args.out, key=args.key, trust_dir=args.trust_dir,
                           name=args.name, version=args.version, min_agreement=args.min_agreement,
                           max_score_delta=args.max_score_delta,
                           opts=Options(per_channel=not args.per_tensor, reduce_range=not args.no_reduce_range),
                           source_note=note)
    signed = f", signed with {args.key}" if args.key else " (not signed: `edgeinferctl model sign` it)"
    print(f"{args.out}: OK: {meta.name} {meta.version} (INT8, family {meta.family}){signed}")
    return 0


def cmd_model_bench(args) -> int:
    from pydantic import ValidationError

    from edgeinfer.config.sections import Provider
    from edgeinfer.models.tools.bench import bench, provider_table
    if args.providers:
        print(provider_table())
        return 0
    if not args.bundle:
        print("edgeinferctl model bench: a bundle to measure (or --providers)", file=sys.stderr)
        return 2
    try:
        provider = Provider.model_validate(args.provider).spec()
    except ValidationError as e:
        print(f"edgeinferctl model bench: --provider {args.provider}: {e.errors()[0]['msg']}", file=sys.stderr)
        return 2
    cpus = [int(c) for c in args.cpus.split(",")] if args.cpus else None
    bench([args.bundle, *([args.compare] if args.compare else [])], args.threads, cpus, args.frames,
          args.geometry, args.pixel_format, provider=provider)
    return 0


def cmd_model_allow_downgrade(args) -> int:
    from edgeinfer.models.rollback import RollbackState
    RollbackState(args.state_dir).allow_downgrade(args.name, args.version)
    print(f"{args.name} {args.version} may be installed once although older than the accepted version")
    return 0


def cmd_model_rollout(args) -> int:
    """A model's rollout against its gates; `promote` or `abort` decide it early."""
    import sys
    from edgeinfer.cli import rolloutview
    from edgeinfer.cli.statusview import Endpoint
    try:
        endpoint = Endpoint(args.url, args.config)
        if args.action == "show":
            print(rolloutview.render(args.name, rolloutview.read(endpoint.url, args.name, endpoint=endpoint)))
            return 0
        state_dir = args.state_dir
        if state_dir is None:  # the daemon's own, from the configuration that says where its metrics are
            try:
                state_dir = rolloutview.state_dir_of(args.config)
            except (ValueError, OSError) as e:  # ConfigError is a ValueError
                raise ValueError(f"cannot tell the daemon's model.state_dir: {e} (give --state-dir DIR, or "
                                 "--config the daemon's configuration)") from None
        code, said = rolloutview.request(endpoint.url, args.name, args.action, state_dir, args.wait, endpoint)
    except (OSError, ValueError) as e:
        print(f"edgeinferctl: {e}", file=sys.stderr)
        return 1
    print(said, file=sys.stdout if code == 0 else sys.stderr)
    return code


def cmd_keys_generate(args) -> int:
    from edgeinfer.models.verify import generate_keys
    key, pub = generate_keys(args.out, args.name, args.curve)
    print(f"private key {key} (0600: keep it off the edge hosts)\npublic key  {pub} (install it in the trust "
          f"store, e.g. /etc/edgeinfer/trust/)")
    return 0
