"""ember.optim"""
