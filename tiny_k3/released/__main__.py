"""`python -m tiny_k3.released INDEX.json[.gz]`: regenerate tiny_k3/released/k3_index_table.json from the
released safetensors index (PipeNetwork/kimi-k3-mlx@fe0738f reference/model.safetensors.index.json.gz)."""

import sys

from . import ReleasedFormatError, write_k3_table

if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m tiny_k3.released INDEX.json[.gz]")
    try:
        print(f"wrote {write_k3_table(sys.argv[1])}")
    except (OSError, ReleasedFormatError) as exc:
        sys.exit(f"error: {exc}")
