bash 2 1 0
