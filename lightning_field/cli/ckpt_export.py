"""``field ckpt export CKPT OUT``: a checkpoint's model weights as one file for inference, verified first."""

from __future__ import annotations

import argparse
import sys

from lightning_field.cli.storage_options import storage_options_of

FORMATS = ("safetensors", "torch")
"""lightning_field.checkpoint.export.FORMATS, spelled out: that module imports torch, and `field --help` must not."""


def cmd_export(args: argparse.Namespace) -> int:
    options = storage_options_of(args)
    # torch, Lightning's types and DCP: imported by the one command that loads tensors, not by `field --help`.
    from lightning_field.checkpoint.export import write_weights
    from lightning_field.checkpoint.safe_load import TRUST_PICKLES_HINT
    from lightning_field.checkpoint.stores import describe_error
    from lightning_field.checkpoint.weights import read_model_weights

    try:
        weights = read_model_weights(
            args.checkpoint,
            "cpu",
            args.trust_pickles,
            strip_prefixes=args.strip_prefix,
            strip_compile_prefix=args.strip_compile_prefix,
            storage_options=options,
        )
        written = write_weights(weights.state_dict, args.out, args.format, weights.step)
    except OSError as err:  # the checkpoint's download or OUT's write: the file system's words, not a refusal
        return _refused(f"cannot export {args.checkpoint} to {args.out}: {describe_error(err)}")
    except (ValueError, RuntimeError, EOFError) as err:
        # ManifestError, CheckpointCorruptError, UnsafeCheckpointError, UnreadableWeightsError, a prefix
        # that matches nothing, a value the format cannot hold, a forged file cut short: each names the cause.
        cause = " ".join(line.strip() for line in str(err).splitlines() if line.strip()).rstrip(".")
        cause = cause.replace(TRUST_PICKLES_HINT, "--trust-pickles")  # this command's opt-in, not the callback's
        return _refused(f"REFUSED {args.checkpoint}: {cause or type(err).__name__}")
    kind = "sharded (DCP) checkpoint" if weights.sharded else "checkpoint"
    print(
        f"wrote {written.path} ({args.format}): {written.tensors} tensors, {written.tensor_bytes:,} bytes of"
        f" weights, {written.file_bytes:,} bytes on disk; step {weights.step}, from the {kind} {args.checkpoint},"
        " verified against its manifest"
    )
    if weights.renamed:
        print(f"  keys renamed: {weights.renamed} ({_stripped(args)})")
    if written.untied:
        print(f"  tied weights written apart (safetensors shares no memory between names): {', '.join(written.untied)}")
    return 0


def _refused(line: str) -> int:
    print(f"field ckpt export: {line}; nothing written", file=sys.stderr)
    return 1


def _stripped(args: argparse.Namespace) -> str:
    removed = [f"prefix {prefix!r}" for prefix in args.strip_prefix]
    if args.strip_compile_prefix:
        removed.append("torch.compile's '_orig_mod.' segments")
    return "removed " + ", then ".join(removed)


def add_export_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    export = sub.add_parser(
        "export",
        help="the model's full weights (its state_dict) as one safetensors or torch file, verified first",
        description=(
            "Write the LightningModule's state_dict of a committed checkpoint (sharded DCP checkpoints assembled"
            " whole on the CPU) to OUT, after every file it reads verified against the manifest. Loads with"
            " safetensors.torch.load_file(OUT) or torch.load(OUT, weights_only=True). Exit 0 once written, 1 when"
            " refused (nothing is written)."
        ),
    )
    export.add_argument("checkpoint", metavar="CKPT", help="a checkpoint directory (or fsspec URL)")
    export.add_argument("out", metavar="OUT", help="the file to write (replaced atomically if it exists)")
    export.add_argument("--format", choices=FORMATS, default="safetensors", help="default: safetensors")
    export.add_argument(
        "--strip-prefix",
        action="append",
        default=[],
        metavar="PREFIX",
        help="remove PREFIX from the start of every key that has it, repeatable, in order (model. for the inner"
        " network of a module that keeps it as self.model); a PREFIX no key has is refused",
    )
    export.add_argument(
        "--strip-compile-prefix",
        action="store_true",
        help="remove the _orig_mod. segments a torch.compile'd submodule adds to its keys",
    )
    export.add_argument(
        "--trust-pickles",
        action="store_true",
        help="load a state.pt that needs a full unpickle (runs its writer's code: only where you trust every writer)",
    )
    export.set_defaults(func=cmd_export)
    return export


__all__ = ["FORMATS", "add_export_parser", "cmd_export"]
