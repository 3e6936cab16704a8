from daytona_kernel.app import main

main()
