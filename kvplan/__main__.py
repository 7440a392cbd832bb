from kvplan import main

main()
