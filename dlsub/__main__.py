from dlsub.agent.cli import main

main()
