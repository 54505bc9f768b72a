from cynomys.cli.main import main

raise SystemExit(main())
