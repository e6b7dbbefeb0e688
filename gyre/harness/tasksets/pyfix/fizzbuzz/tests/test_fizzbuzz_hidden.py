from fizzbuzz import fizzbuzz


def test_length():
    assert len(fizzbuzz(5)) == 5

def test_fifteen():
    assert fizzbuzz(15)[-1] == "FizzBuzz"

def test_first_three():
    assert fizzbuzz(3) == ["1", "2", "Fizz"]

def test_five():
    assert fizzbuzz(5)[4] == "Buzz"

def test_zero():
    assert fizzbuzz(0) == []
