from calc import biggest

assert biggest(2, 3) == 3
print("OK")
