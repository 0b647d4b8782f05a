"""ember.autograd"""
