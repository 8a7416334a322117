from swarmd.cli import main

main()
