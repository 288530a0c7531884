from ccoverlap.cli import main

raise SystemExit(main())
