"""`python -m app`: the same as `dmad-studio`."""
from app.main import main

raise SystemExit(main())
