from genlab.cli import main

raise SystemExit(main())
