from dsv4kit.cli import main

raise SystemExit(main())
