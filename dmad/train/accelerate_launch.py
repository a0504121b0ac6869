"""`python -m dmad.train.accelerate_launch <accelerate launch arguments>`: accelerate's own launcher
(dmad.train.launch.accelerate_command starts it for a multi-process run), then, like every engine
process (dmad.cli.entry), the interpreter's last cyclic collection skipped: with torch loaded it
held the launcher up ~0.5 s after its ranks had ended. The bundle's `accelerate-launch` does the
same (packaging/entry.py)."""
import gc

from accelerate.commands.launch import main

if __name__ == "__main__":
    main()
    gc.freeze()
