from tensor_debugger.cli import main

raise SystemExit(main())
