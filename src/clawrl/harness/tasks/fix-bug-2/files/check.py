from calc import sub

assert sub(5, 3) == 2
print("OK")
