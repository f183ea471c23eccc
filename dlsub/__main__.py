from dlsub.cli.main import main

main()
