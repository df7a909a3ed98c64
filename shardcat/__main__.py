from shardcat.cli import main

main()
