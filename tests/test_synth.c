#include <criterion/criterion.h>
Test(synth, placeholder) {}
