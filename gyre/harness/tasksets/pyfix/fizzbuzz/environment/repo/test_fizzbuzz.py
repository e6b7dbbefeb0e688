from fizzbuzz import fizzbuzz


def test_length():
    assert len(fizzbuzz(5)) == 5

def test_fifteen():
    assert fizzbuzz(15)[-1] == "FizzBuzz"
