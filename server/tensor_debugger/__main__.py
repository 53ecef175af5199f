from tensor_debugger.cli.main import main

raise SystemExit(main())
