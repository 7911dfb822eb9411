from flint.cli import main

main()
