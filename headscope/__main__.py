"""`python -m headscope ...`, the same as the `headscope` command; what `torchrun -m headscope` and
`accelerate launch -m headscope` start in every process (see headscope.distributed)."""

from headscope.cli import main

if __name__ == "__main__":
    main()
