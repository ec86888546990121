from calc import add

assert add(2, 3) == 5
print("OK")
