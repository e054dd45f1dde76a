from app.process.cli import main

raise SystemExit(main())
