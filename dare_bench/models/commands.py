"""`dare-bench checkpoint shrink`: write a shrunk real checkpoint (real field set, ids, tokenizer; random weights).

    dare-bench checkpoint shrink LLaDA-8B-Instruct OUT --layers 2 --hidden 256         # + a stand-in tokenizer
    dare-bench checkpoint shrink /ckpt-metadata/Dream-v0-Instruct-7B OUT --json     # copies tokenizer + template
"""

from __future__ import annotations

import json
from typing import Optional

import typer


def register(app: typer.Typer) -> None:
    checkpoint = typer.Typer(help="Checkpoint tools (shrunk real-architecture checkpoints for CPU tests).",
                             no_args_is_help=True)
    app.add_typer(checkpoint, name="checkpoint")

    @checkpoint.command("shrink")
    def shrink_cmd(
        source: str = typer.Argument(..., help="A shipped real config by name (e.g. LLaDA-8B-Instruct, see "
                                               "dare_bench/models/checkpoint_configs/) or a checkpoint / metadata "
                                               "dir with config.json (its tokenizer files are copied)."),
        out: str = typer.Argument(..., help="New directory to write (refused if it exists)."),
        layers: int = typer.Option(2, "--layers", min=1, help="Decoder layers."),
        hidden: int = typer.Option(256, "--hidden", min=8, help="Hidden size (a multiple of the real head_dim)."),
        experts: Optional[int] = typer.Option(None, "--experts", min=1, help="Routed experts of MoE backbones "
                                                                              "(default: 2 x the real top-k)."),
        seed: int = typer.Option(0, "--seed", help="Seed of the random weights."),
        dtype: str = typer.Option("bfloat16", "--dtype", help="Weight dtype on disk: bfloat16 | float32."),
        as_json: bool = typer.Option(False, "--json", help="Print a JSON summary."),
    ) -> None:
        """Write a shrunk checkpoint of a real backbone: same config fields, key names, special ids; random weights."""
        from dare_bench.models.shrink import shrink_checkpoint

        summary = shrink_checkpoint(source, out, layers=layers, hidden=hidden, experts=experts, seed=seed,
                                    dtype=dtype)
        if as_json:
            typer.echo(json.dumps(summary))
            return
        typer.echo(f"{summary['family']}: {summary['parameters']:,} parameters "
                   f"({summary['embedding_share']:.0%} embeddings) -> {summary['directory']}")
        if summary["tokenizer"] == "stand-in":
            typer.echo("note: the source has no tokenizer files; wrote a stand-in tokenizer with the real special ids "
                       "(see STANDIN_TOKENIZER.md in the directory)", err=True)
