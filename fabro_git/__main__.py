from fabro_git.cli import main

raise SystemExit(main())
