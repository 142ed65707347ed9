from fedface.cli import main

raise SystemExit(main())
