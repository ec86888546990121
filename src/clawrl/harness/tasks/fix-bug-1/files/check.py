from calc import mul

assert mul(2, 3) == 6
print("OK")
