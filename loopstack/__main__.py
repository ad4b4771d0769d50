from loopstack.cli import main

main()
